package main

import (
	"flag"
	"fmt"
	"image"
	"image/color"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart colours by series name (the matrix's targets: storaged, the
// no-op floors, a base build, the peers); other series take the next of
// otherColors, in their order on the chart.
var seriesColors = map[string]color.RGBA{
	"floor":          {40, 40, 40, 255},
	"bare":           {150, 150, 150, 255},
	"edge":           {46, 160, 67, 255},
	"async":          {31, 119, 180, 255},
	"sync":           {214, 80, 40, 255},
	"base-async":     {158, 202, 225, 255},
	"base-sync":      {244, 165, 130, 255},
	"nats":           {148, 103, 189, 255},
	"nats-always":    {197, 176, 213, 255},
	"redis-everysec": {140, 86, 75, 255},
	"redis-always":   {196, 156, 148, 255},
	targetR3:         {128, 0, 64, 255},    // a deep red: sync, three times
	targetR3Keyed:    {204, 102, 153, 255}, // the same, lighter
}

// otherColors are the rest of matplotlib's tab10 palette, then greys.
var otherColors = []color.RGBA{
	{227, 119, 194, 255}, // pink
	{188, 189, 34, 255},  // olive
	{23, 190, 207, 255},  // cyan
	{255, 127, 14, 255},  // orange
	{90, 90, 90, 255},
	{190, 190, 190, 255},
}

// series is one line of a chart: its legend name and its points in x
// order. color nil means seriesColors[name], else the next of
// otherColors. Any source of points can make one (the matrix's targets,
// chartSeries; a peer system measured by another tool).
type series struct {
	name   string
	points []point
	color  color.Color
}

// point is one x of a series: the median y over the runs and its range
// lo..hi (min..max), drawn as a bar.
type point struct{ x, y, lo, hi float64 }

// chartText is what a chart says besides its series.
type chartText struct {
	title    string
	subtitle []string // smaller lines under the title
	xlabel   string
	ylabel   string
}

// runChartCommand is the chart subcommand: it draws median throughput
// against concurrency for every target of a matrix results file, one line
// per target, for the cases of one method.
func runChartCommand(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("storaged-bench chart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "bench-results.json", "matrix results `file`")
	out := fs.String("out", "bench-throughput.png", "PNG `file` to write")
	method := fs.String("method", methodUnary, "draw the cases of this `method` (unary, batch or stream)")
	title := fs.String("title", "", "chart title (default: from the method)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	res, err := readMatrixResult(*in)
	if err != nil {
		return err
	}
	ss, xlabel := chartSeries(res, *method)
	if len(ss) == 0 {
		return fmt.Errorf("%s has no %s cases", *in, *method)
	}
	if *title == "" {
		*title = map[string]string{
			methodUnary:  "storaged PutMessage: throughput vs concurrency",
			methodBatch:  "storaged PutMessages: throughput vs concurrency",
			methodStream: "storaged PutMessageStream: throughput vs messages in flight",
		}[*method]
	}
	txt := chartText{
		title: *title,
		subtitle: []string{
			fmt.Sprintf("%d B bodies, loopback, median of %d runs of %.0fs, bars min-max", res.BodySize, res.Runs, res.DurationSeconds),
			fmt.Sprintf("%d CPU %s, %s", res.Machine.NProc, res.Machine.CPU, res.Date[:min(10, len(res.Date))]),
		},
		xlabel: xlabel,
		ylabel: "msgs/s",
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if err := drawChart(f, txt, ss); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chartSeries picks the cases of method and returns one series per target,
// ordered as the results list their targets, and the x axis label.
func chartSeries(res *MatrixResult, method string) ([]series, string) {
	var cases []*caseResult
	for _, c := range res.Cases {
		if c.Method == method {
			cases = append(cases, c)
		}
	}
	xOf := func(c *caseResult) float64 { return float64(c.Concurrency) }
	xlabel := "concurrent calls"
	if method == methodStream {
		xOf = func(c *caseResult) float64 { return float64(c.Concurrency * c.Streams) }
		xlabel = "messages in flight (streams × per stream)"
	}
	slices.SortStableFunc(cases, func(a, b *caseResult) int {
		switch {
		case xOf(a) < xOf(b):
			return -1
		case xOf(a) > xOf(b):
			return 1
		}
		return 0
	})
	var out []series
	for _, t := range res.Targets {
		s := series{name: t}
		for _, c := range cases {
			tr := c.Targets[t]
			if tr == nil || (len(tr.Runs) == 0 && tr.MsgsPerSec == Stat{}) {
				continue // the target did not run this case
			}
			s.points = append(s.points, point{x: xOf(c), y: tr.MsgsPerSec.Median, lo: tr.MsgsPerSec.Min, hi: tr.MsgsPerSec.Max})
		}
		if len(s.points) > 0 {
			out = append(out, s)
		}
	}
	return out, xlabel
}

// Chart size in pixels (at vgimg's 96 dpi), and the strip on the right
// that holds the legend.
const (
	chartW, chartH = 1000, 620
	legendW        = 130 // points
)

// drawChart writes a PNG of ss (gonum.org/v1/plot): one line with markers
// and min..max bars per series, on a log x axis with a tick at every x of
// the data and a linear y axis from 0; the legend on the right. Series
// need not share their xs.
func drawChart(w io.Writer, txt chartText, ss []series) error {
	var xs []float64
	ymax := 0.0
	for _, s := range ss {
		for _, p := range s.points {
			if p.x <= 0 || math.IsInf(p.x, 0) || math.IsNaN(p.x) {
				return fmt.Errorf("chart: series %s: x %v on a log axis", s.name, p.x)
			}
			if !slices.Contains(xs, p.x) {
				xs = append(xs, p.x)
			}
			ymax = max(ymax, p.hi, p.y)
		}
	}
	if len(xs) == 0 {
		return fmt.Errorf("chart: no points")
	}
	slices.Sort(xs)

	p := plot.New()
	p.X.Label.Text, p.Y.Label.Text = txt.xlabel, txt.ylabel
	p.X.Scale = plot.LogScale{}
	p.X.Min, p.X.Max = xs[0]/1.3, xs[len(xs)-1]*1.3
	var xticks plot.ConstantTicks
	for _, x := range xs {
		xticks = append(xticks, plot.Tick{Value: x, Label: shortNumber(x)})
	}
	p.X.Tick.Marker = xticks
	yt, top := newYTicks(ymax)
	p.Y.Min, p.Y.Max, p.Y.Tick.Marker = 0, top, yt
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = chartFont(13)
		a.Tick.Label.Font = chartFont(12)
		a.Padding = 0
	}
	grid := plotter.NewGrid()
	grid.Vertical.Width = 0
	grid.Horizontal.Color = color.Gray{Y: 215}
	p.Add(grid)

	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.TextStyle.Font = chartFont(13)
	legend.ThumbnailWidth = vg.Points(22)
	legend.Padding = vg.Points(6)
	next := 0
	for _, s := range ss {
		c := s.color
		if c == nil {
			if known, ok := seriesColors[s.name]; ok {
				c = known
			} else {
				c = otherColors[next%len(otherColors)]
				next++
			}
		}
		pts := chartPoints(s.points)
		bars, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return fmt.Errorf("chart: series %s: %w", s.name, err)
		}
		bars.Color, bars.Width, bars.CapWidth = c, vg.Points(1), vg.Points(7)
		line, marks, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("chart: series %s: %w", s.name, err)
		}
		line.Color, line.Width = c, vg.Points(2.5)
		marks.Shape, marks.Color, marks.Radius = draw.BoxGlyph{}, c, vg.Points(3.5)
		p.Add(bars, line, marks)
		legend.Add(s.name, line, marks)
	}

	img := vgimg.NewWith(vgimg.UseImage(image.NewRGBA(image.Rect(0, 0, chartW, chartH))))
	dc := draw.New(img)
	dc = draw.Crop(dc, 12, -12, 10, -12)
	head := drawHeading(&dc, txt)
	p.Draw(draw.Crop(dc, 0, -legendW, 0, -head))
	legend.Draw(draw.Crop(dc, dc.Size().X-legendW+16, 0, 0, -head-12))
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// drawHeading writes the title and the subtitle lines centred at the top of
// c and returns the height they take.
func drawHeading(c *draw.Canvas, txt chartText) vg.Length {
	style := func(size vg.Length) text.Style {
		return text.Style{Color: color.Black, Font: chartFont(size), XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	}
	y := c.Max.Y
	line := func(s text.Style, str string) {
		c.FillText(s, vg.Point{X: c.Center().X, Y: y}, str)
		y -= s.Rectangle(str).Size().Y + 4
	}
	line(style(18), txt.title)
	for _, l := range txt.subtitle {
		line(style(12), l)
	}
	return c.Max.Y - y + 8
}

// chartFont is Liberation Sans (embedded in gonum/plot) at size points.
func chartFont(size vg.Length) font.Font {
	return font.From(font.Font{Typeface: "Liberation", Variant: "Sans"}, size)
}

// chartPoints adapts points to plotter.XYer and plotter.YErrorer (bars
// from lo to hi around y).
type chartPoints []point

func (c chartPoints) Len() int                    { return len(c) }
func (c chartPoints) XY(i int) (float64, float64) { return c[i].x, c[i].y }
func (c chartPoints) YError(i int) (float64, float64) {
	return c[i].y - c[i].lo, c[i].hi - c[i].y
}

// yTicks labels the y axis from 0 in steps of 1, 2 or 5 times a power of
// ten, about five of them; the axis ends on the first step above the data.
type yTicks struct{ step float64 }

// newYTicks returns the ticks for data up to ymax and the top of the axis.
func newYTicks(ymax float64) (yTicks, float64) {
	step := niceStep(ymax * 1.05 / 5)
	top := math.Ceil(ymax*1.05/step) * step
	if top <= 0 {
		return yTicks{step: 1}, 1
	}
	return yTicks{step: step}, top
}

func (t yTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for i := math.Ceil(lo / t.step); i*t.step <= hi+t.step/1e6; i++ {
		ts = append(ts, plot.Tick{Value: i * t.step, Label: shortNumber(i * t.step)})
	}
	return ts
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// shortNumber formats v as 950, 1.5K, 20K, 1.2M.
func shortNumber(v float64) string {
	f := func(x float64, suffix string) string {
		s := fmt.Sprintf("%.1f", x)
		return strings.TrimSuffix(s, ".0") + suffix
	}
	switch {
	case v >= 1e6:
		return f(v/1e6, "M")
	case v >= 1e3:
		return f(v/1e3, "K")
	}
	return f(v, "")
}
