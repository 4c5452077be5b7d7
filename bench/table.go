package main

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Row is one line of the results table: a figure measured on Kairos, the
// baseline measured in the same run (absent for rows that have none), their
// ratio and the target for it.
type Row struct {
	ID       string
	Measures string
	Unit     string // the figure's and the baseline's unit
	Figure   stats
	Baseline *stats // nil when the row has no baseline
	// Ratio is formed as RatioOf says: per run, from the figure and the
	// baseline measured side by side in that run, and then the median of the
	// runs' ratios (RatioRuns has them all); from the two medians when the
	// row's samples do not pair up by run. NaN when the row has no ratio.
	Ratio     float64
	RatioRuns *stats
	RatioOf   string // how Ratio is formed, e.g. "figure/baseline"
	Target    string // the target, as text; "" when none
	// Met says whether the target is met; nil when the row has no target.
	Met *bool
	// ZeroOK marks figures that may honestly be zero (bytes of WAL while
	// idle); every other figure must be positive to count as measured.
	ZeroOK bool
}

// Finite reports whether every figure of the row was measured: finite
// numbers, positive unless ZeroOK, and a finite ratio where the row has one.
func (r Row) Finite() error {
	check := func(what string, s stats) error {
		for _, v := range []float64{s.Median, s.Min, s.Max} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("%s: %s is %v", r.ID, what, v)
			}
			if v < 0 || (v == 0 && !r.ZeroOK) {
				return fmt.Errorf("%s: %s is %v, not a measured figure", r.ID, what, v)
			}
		}
		if s.N < 1 {
			return fmt.Errorf("%s: %s has no samples", r.ID, what)
		}
		return nil
	}
	if err := check("figure", r.Figure); err != nil {
		return err
	}
	if r.Baseline != nil {
		if err := check("baseline", *r.Baseline); err != nil {
			return err
		}
	}
	if r.RatioOf != "" && (math.IsNaN(r.Ratio) || math.IsInf(r.Ratio, 0)) {
		return fmt.Errorf("%s: ratio is %v", r.ID, r.Ratio)
	}
	return nil
}

// newRow builds a row; ratio is applied run by run when the row has a
// baseline and a ratio (see Row.Ratio), and met judges the ratio (or the
// figure when the row has no ratio). A drift of the machine between runs
// moves a run's figure and baseline together, so the ratio of each run
// cancels it where a ratio of medians taken from different runs would not.
func newRow(id, measures, unit string, fig []float64, base []float64, ratioOf string, ratio func(f, b float64) float64, target string, met func(fig, ratio float64) bool) Row {
	r := Row{ID: id, Measures: measures, Unit: unit, Figure: summarize(fig), Ratio: math.NaN(), RatioOf: ratioOf, Target: target}
	if base != nil {
		b := summarize(base)
		r.Baseline = &b
	}
	if ratio != nil && r.Baseline != nil {
		if len(fig) == len(base) {
			per := make([]float64, len(fig))
			for i := range fig {
				per[i] = ratio(fig[i], base[i])
			}
			rs := summarize(per)
			r.Ratio, r.RatioRuns = rs.Median, &rs
		} else {
			r.Ratio = ratio(r.Figure.Median, r.Baseline.Median)
		}
	}
	if met != nil {
		m := met(r.Figure.Median, r.Ratio)
		r.Met = &m
	}
	return r
}

func div(a, b float64) float64 { return a / b }

func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "NaN"
	case a >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func fmtStats(s stats, unit string) string {
	if s.N > 1 {
		return fmt.Sprintf("%s %s (%s–%s)", fmtNum(s.Median), unit, fmtNum(s.Min), fmtNum(s.Max))
	}
	return fmt.Sprintf("%s %s", fmtNum(s.Median), unit)
}

// printTable writes rows as a Markdown table.
func printTable(w io.Writer, rows []Row) {
	fmt.Fprintln(w, "| id | measures | figure, median (min–max) | baseline, same run | ratio | target | met |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		base, ratio, met := "—", "—", "—"
		if r.Baseline != nil {
			base = fmtStats(*r.Baseline, r.Unit)
		}
		if r.RatioOf != "" {
			ratio = fmt.Sprintf("%.3g× (%s)", r.Ratio, r.RatioOf)
			if rr := r.RatioRuns; rr != nil && rr.N > 1 {
				ratio = fmt.Sprintf("%.3g× (%.3g–%.3g; %s)", r.Ratio, rr.Min, rr.Max, r.RatioOf)
			}
		}
		if r.Met != nil {
			met = map[bool]string{true: "yes", false: "**NO**"}[*r.Met]
		}
		target := r.Target
		if target == "" {
			target = "—"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.ID, strings.ReplaceAll(r.Measures, "|", "/"),
			fmtStats(r.Figure, r.Unit), base, ratio, target, met)
	}
}
