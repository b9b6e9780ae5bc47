package main

import (
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

// Chart colours by target; unknown targets get grey.
var seriesColors = map[string]color.RGBA{
	"floor": {40, 40, 40, 255},
	"bare":  {150, 150, 150, 255},
	"edge":  {46, 160, 67, 255},
	"async": {31, 119, 180, 255},
	"sync":  {214, 80, 40, 255},
}

// series is one target's line: x is the concurrency, y the median msgs/s
// and lo..hi its min..max over the runs.
type series struct {
	name      string
	x         []float64
	y, lo, hi []float64
	colour    color.RGBA
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
	sub := []string{
		fmt.Sprintf("%d B bodies, loopback, median of %d runs of %.0fs, bars min-max", res.BodySize, res.Runs, res.DurationSeconds),
		fmt.Sprintf("%d CPU %s, %s", res.Machine.NProc, res.Machine.CPU, res.Date[:min(10, len(res.Date))]),
	}
	img := drawChart(ss, *title, sub, xlabel, "msgs/s")
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
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
		s := series{name: t, colour: color.RGBA{120, 120, 120, 255}}
		if c, ok := seriesColors[t]; ok {
			s.colour = c
		}
		for _, c := range cases {
			tr := c.Targets[t]
			if tr == nil || len(tr.Runs) == 0 {
				continue
			}
			s.x = append(s.x, xOf(c))
			s.y = append(s.y, tr.MsgsPerSec.Median)
			s.lo = append(s.lo, tr.MsgsPerSec.Min)
			s.hi = append(s.hi, tr.MsgsPerSec.Max)
		}
		if len(s.x) > 0 {
			out = append(out, s)
		}
	}
	return out, xlabel
}

// Chart geometry, in pixels.
const (
	chartW, chartH = 1000, 620
	marginL        = 110
	marginR        = 160
	marginT        = 130
	marginB        = 80
	textScale      = 2
)

var (
	white     = color.RGBA{255, 255, 255, 255}
	ink       = color.RGBA{30, 30, 30, 255}
	gridColor = color.RGBA{225, 225, 225, 255}
)

// drawChart renders the series on a log2 x axis and a linear y axis from 0.
func drawChart(ss []series, title string, subtitle []string, xlabel, ylabel string) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, chartW, chartH))
	fillRect(img, 0, 0, chartW, chartH, white)
	x0, x1 := marginL, chartW-marginR
	y0, y1 := chartH-marginB, marginT // y0 is the bottom

	var xs []float64
	ymax := 0.0
	for _, s := range ss {
		for i := range s.x {
			if !slices.Contains(xs, s.x[i]) {
				xs = append(xs, s.x[i])
			}
			ymax = max(ymax, s.hi[i], s.y[i])
		}
	}
	slices.Sort(xs)
	lx0, lx1 := math.Log2(xs[0]), math.Log2(xs[len(xs)-1])
	if lx1 == lx0 {
		lx0, lx1 = lx0-1, lx1+1
	}
	px := func(x float64) int {
		pad := 0.04 * float64(x1-x0)
		return x0 + int(pad+(math.Log2(x)-lx0)/(lx1-lx0)*(float64(x1-x0)-2*pad))
	}
	step := niceStep(ymax / 5)
	top := math.Ceil(ymax*1.05/step) * step
	if top == 0 {
		top, step = 1, 1
	}
	py := func(y float64) int { return y0 - int(y/top*float64(y0-y1)) }

	// Grid, ticks and labels.
	for v := 0.0; v <= top+step/2; v += step {
		y := py(v)
		hline(img, x0, x1, y, gridColor)
		l := shortNumber(v)
		drawText(img, x0-12-textWidth(l, textScale), y-textHeight(textScale)/2, l, textScale, ink)
	}
	for _, x := range xs {
		p := px(x)
		vline(img, p, y0, y0+6, ink)
		l := shortNumber(x)
		drawText(img, p-textWidth(l, textScale)/2, y0+12, l, textScale, ink)
	}
	hline(img, x0, x1, y0, ink)
	vline(img, x0, y1, y0, ink)
	drawText(img, (x0+x1-textWidth(xlabel, textScale))/2, y0+40, xlabel, textScale, ink)
	drawText(img, x0-textWidth(ylabel, textScale)/2, y1-28, ylabel, textScale, ink)
	drawText(img, (chartW-textWidth(title, 3))/2, 14, title, 3, ink)
	for i, l := range subtitle {
		drawText(img, (chartW-textWidth(l, textScale))/2, 48+i*22, l, textScale, ink)
	}

	// Series: min-max bars, lines, markers.
	for _, s := range ss {
		for i := range s.x {
			p := px(s.x[i])
			vline(img, p, py(s.hi[i]), py(s.lo[i]), s.colour)
			hline(img, p-4, p+4, py(s.hi[i]), s.colour)
			hline(img, p-4, p+4, py(s.lo[i]), s.colour)
		}
		for i := 1; i < len(s.x); i++ {
			thickLine(img, px(s.x[i-1]), py(s.y[i-1]), px(s.x[i]), py(s.y[i]), s.colour)
		}
		for i := range s.x {
			fillRect(img, px(s.x[i])-4, py(s.y[i])-4, 9, 9, s.colour)
		}
	}

	// Legend.
	lx, ly := x1+24, y1+10
	for _, s := range ss {
		fillRect(img, lx, ly+2, 22, 10, s.colour)
		drawText(img, lx+32, ly, s.name, textScale, ink)
		ly += 30
	}
	return img
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

func fillRect(img *image.RGBA, x, y, w, h int, c color.Color) {
	r := image.Rect(x, y, x+w, y+h).Intersect(img.Bounds())
	for yy := r.Min.Y; yy < r.Max.Y; yy++ {
		for xx := r.Min.X; xx < r.Max.X; xx++ {
			img.Set(xx, yy, c)
		}
	}
}

func hline(img *image.RGBA, xa, xb, y int, c color.Color) {
	fillRect(img, min(xa, xb), y, abs(xb-xa)+1, 1, c)
}

func vline(img *image.RGBA, x, ya, yb int, c color.Color) {
	fillRect(img, x, min(ya, yb), 1, abs(yb-ya)+1, c)
}

// thickLine draws a 3-pixel line from (xa, ya) to (xb, yb) (Bresenham).
func thickLine(img *image.RGBA, xa, ya, xb, yb int, c color.Color) {
	dx, dy := abs(xb-xa), -abs(yb-ya)
	sx, sy := 1, 1
	if xa > xb {
		sx = -1
	}
	if ya > yb {
		sy = -1
	}
	e := dx + dy
	for {
		fillRect(img, xa-1, ya-1, 3, 3, c)
		if xa == xb && ya == yb {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			xa += sx
		}
		if e2 <= dx {
			e += dx
			ya += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
