package main

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"testing"
)

// chartGolden is the unary cases of the matrix run of 2026-11-29 14:40 UTC
// (BENCHMARKS.md), from which docs/bench-throughput.png is drawn.
const chartGolden = "testdata/matrix-unary-2026-11-29.json"

// colorCounts counts the pixels of img by colour (opaque RGB).
func colorCounts(img image.Image) map[[3]uint8]int {
	out := map[[3]uint8]int{}
	if m, ok := img.(*image.RGBA); ok { // what png.Decode returns for the chart
		for i := 0; i+3 < len(m.Pix); i += 4 {
			out[[3]uint8{m.Pix[i], m.Pix[i+1], m.Pix[i+2]}]++
		}
		return out
	}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			out[[3]uint8{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8)}]++
		}
	}
	return out
}

// rgb is c as a colorCounts key.
func rgb(c color.Color) [3]uint8 {
	r, g, b, _ := c.RGBA()
	return [3]uint8{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8)}
}

// TestChartSeriesFromResults: the matrix results become one series per
// target, in the results' order, x ascending, with median and min..max.
func TestChartSeriesFromResults(t *testing.T) {
	res, err := readMatrixResult(chartGolden)
	if err != nil {
		t.Fatal(err)
	}
	ss, xlabel := chartSeries(res, methodUnary)
	if len(ss) != 3 || ss[0].name != "floor" || ss[1].name != "async" || ss[2].name != "sync" || xlabel != "concurrent calls" {
		t.Fatalf("series %+v, x label %q", ss, xlabel)
	}
	for _, s := range ss {
		if len(s.points) != 5 {
			t.Fatalf("%s: %d points", s.name, len(s.points))
		}
		for i, p := range s.points {
			if want := float64(int(1) << (2 * i)); p.x != want || p.lo > p.y || p.y > p.hi {
				t.Errorf("%s point %d: %+v, want x %v and lo ≤ y ≤ hi", s.name, i, p, want)
			}
		}
	}
	if p := ss[1].points[3]; p != (point{x: 64, y: 23614, lo: 23345, hi: 27733}) {
		t.Errorf("async at 64: %+v", p)
	}
	if ss, _ := chartSeries(res, methodBatch); len(ss) != 0 {
		t.Errorf("batch series from unary results: %+v", ss)
	}
}

// TestDrawChartSeries: N series, some without a colour of their own and
// with xs of their own (a peer system next to storaged's targets), are
// all drawn, each in its colour, on a chart of the documented size.
func TestDrawChartSeries(t *testing.T) {
	res, err := readMatrixResult(chartGolden)
	if err != nil {
		t.Fatal(err)
	}
	ss, xlabel := chartSeries(res, methodUnary)
	ss = append(ss,
		series{name: "peer-a", points: []point{{2, 5000, 4000, 6000}, {32, 25000, 24000, 26000}, {512, 30000, 29000, 36000}}},
		series{name: "peer-b", points: []point{{8, 9000, 9000, 9000}, {128, 15000, 14000, 16000}}},
		series{name: "peer-c", points: []point{{4, 1000, 900, 1100}}, color: color.RGBA{0, 200, 0, 255}},
	)
	var buf bytes.Buffer
	if err := drawChart(&buf, chartText{title: "t", subtitle: []string{"a", "b"}, xlabel: xlabel, ylabel: "msgs/s"}, ss); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != chartW || b.Dy() != chartH {
		t.Errorf("chart is %v, want %dx%d", b, chartW, chartH)
	}
	counts := colorCounts(img)
	for name, c := range map[string]color.Color{
		"floor": seriesColors["floor"], "async": seriesColors["async"], "sync": seriesColors["sync"],
		"peer-a": otherColors[0], "peer-b": otherColors[1], "peer-c": color.RGBA{0, 200, 0, 255},
	} {
		// A line and its markers, or for one point a marker, a bar and the
		// legend's thumbnail: well over 100 pixels.
		if n := counts[rgb(c)]; n < 100 {
			t.Errorf("%s: %d pixels of its colour %v", name, n, c)
		}
	}
	if n := counts[rgb(otherColors[2])]; n != 0 {
		t.Errorf("%d pixels of a colour no series has", n)
	}

	for _, bad := range [][]series{
		nil,
		{{name: "empty"}},
		{{name: "zero x", points: []point{{0, 1, 1, 1}}}},
	} {
		if err := drawChart(&bytes.Buffer{}, chartText{}, bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestNiceStepAndTicks(t *testing.T) {
	for v, want := range map[float64]float64{0.7: 1, 3: 5, 1200: 2000, 50000: 50000} {
		if got := niceStep(v); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", v, got, want)
		}
	}
	yt, top := newYTicks(31458)
	var labels []string
	for _, tk := range yt.Ticks(0, top) {
		labels = append(labels, tk.Label)
	}
	if top != 40000 || len(labels) != 5 || labels[0] != "0" || labels[4] != "40K" {
		t.Errorf("ticks for 31458: top %v, %q", top, labels)
	}
}

// TestSeriesColors: every target the matrix knows has a colour of its own,
// none shared with another target or with the colours of other series.
func TestSeriesColors(t *testing.T) {
	seen := map[color.RGBA]string{}
	for _, c := range otherColors {
		seen[c] = "otherColors"
	}
	for _, target := range knownTargets {
		c, ok := seriesColors[target]
		if !ok {
			t.Errorf("target %s has no colour", target)
			continue
		}
		if other, dup := seen[c]; dup {
			t.Errorf("target %s has the colour of %s", target, other)
		}
		seen[c] = target
	}
}
