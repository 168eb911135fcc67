// Command orl-monitoring-check validates the chart's monitoring objects with the libraries of the
// tools that read them, so that a dashboard or an alert that Grafana or Prometheus would refuse (or
// silently misread) fails the tests instead of a deploy:
//
//	orl-monitoring-check dashboard FILE   # a Grafana dashboard (classic JSON model)
//	orl-monitoring-check rules FILE       # a PrometheusRule (YAML or JSON)
//
// The dashboard is decoded strictly by the Grafana Foundation SDK's model (an unknown field, a wrong
// type or a missing required field fails, panel options included, for the SDK's panel plugins), then
// validated by it; every target must be a Prometheus query whose expression Prometheus' own PromQL
// parser accepts once Grafana's variables are filled in. The PrometheusRule is decoded strictly into
// the Prometheus Operator's Go type; every group needs a unique name, every rule exactly one of
// alert/record and an expression the PromQL parser accepts, every alert a severity label and a summary.
//
// It prints every problem on stderr and exits 1 when there is one (2 for a wrong command line). It
// knows nothing about which metrics the dashboard queries: tests/deploy/monitoring.py checks those
// against what the running services export.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const usage = "usage: orl-monitoring-check dashboard FILE | rules FILE"

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var found []string
	switch os.Args[1] {
	case "dashboard":
		found = checkDashboard(raw)
	case "rules":
		found = checkRules(raw)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	for _, problem := range found {
		fmt.Fprintf(os.Stderr, "%s: %s\n", os.Args[2], problem)
	}
	if len(found) > 0 {
		os.Exit(1)
	}
	fmt.Printf("%s: valid %s\n", os.Args[2], os.Args[1])
}

// -- the dashboard --------------------------------------------------------------------------------

func checkDashboard(raw []byte) []string {
	// The panel and query plugins' own models: without them options and targets are opaque maps.
	plugins.RegisterDefaultPlugins()
	var board dashboard.Dashboard
	if found := lines(board.UnmarshalJSONStrict(raw)); len(found) > 0 {
		return found
	}
	found := lines(board.Validate())
	// The SDK's strict decoders return an empty cog.BuildErrors when all is well, which its decoders
	// of a panel-or-row and of a target take for a failure: the decoded board lacks every panel and
	// every target (their errors do come through, above). So they are decoded and validated here one
	// by one.
	var layout struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &layout); err != nil {
		return []string{err.Error()}
	}
	for i, item := range layout.Panels {
		found = append(found, checkPanel(fmt.Sprintf("panels[%d]", i), item)...)
	}
	return found
}

func checkPanel(where string, raw json.RawMessage) []string {
	var shape struct {
		Type    string            `json:"type"`
		Title   string            `json:"title"`
		Panels  []json.RawMessage `json:"panels"`
		Targets []json.RawMessage `json:"targets"`
	}
	if err := json.Unmarshal(raw, &shape); err != nil {
		return []string{fmt.Sprintf("%s: %v", where, err)}
	}
	where = fmt.Sprintf("%s (%s)", where, shape.Title)
	if shape.Type == "row" {
		var row dashboard.RowPanel
		_ = row.UnmarshalJSONStrict(raw) // its errors came with the board's
		found := prefixed(where, lines(row.Validate()))
		for i, item := range shape.Panels { // a collapsed row's
			found = append(found, checkPanel(fmt.Sprintf("%s.panels[%d]", where, i), item)...)
		}
		return found
	}
	var panel dashboard.Panel
	_ = panel.UnmarshalJSONStrict(raw) // its errors came with the board's
	found := prefixed(where, lines(panel.Validate()))
	if len(shape.Targets) == 0 && shape.Type != "text" {
		found = append(found, where+": no targets")
	}
	for i, item := range shape.Targets {
		found = append(found, checkTarget(fmt.Sprintf("%s.targets[%d]", where, i), item)...)
	}
	return found
}

// checkTarget: a Prometheus query (the only data source the dashboard uses) whose expression the
// PromQL parser accepts once Grafana's variables are filled in.
func checkTarget(where string, raw json.RawMessage) []string {
	var query prometheus.Dataquery
	if found := lines(query.UnmarshalJSONStrict(raw)); len(found) > 0 {
		return prefixed(where, found)
	}
	found := prefixed(where, lines(query.Validate()))
	if query.Datasource == nil || query.Datasource.Type == nil || *query.Datasource.Type != "prometheus" {
		found = append(found, where+": not a Prometheus query (give it a datasource of type prometheus)")
	}
	if _, err := parser.NewParser(parser.Options{}).ParseExpr(fillVariables(query.Expr)); err != nil {
		found = append(found, fmt.Sprintf("%s: expr: %v", where, err))
	}
	return found
}

var (
	rangeVariable = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)
	variable      = regexp.MustCompile(`\$\{[A-Za-z0-9_:.]+\}|\$[A-Za-z_][A-Za-z0-9_]*`)
)

// fillVariables puts what Grafana would in place of its variables: durations for the interval ones,
// a plain word for the dashboard's own (they stand for label values, inside quotes).
func fillVariables(expr string) string {
	return variable.ReplaceAllString(rangeVariable.ReplaceAllString(expr, "5m"), "x")
}

// -- the PrometheusRule ---------------------------------------------------------------------------

func checkRules(raw []byte) []string {
	asJSON, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return []string{err.Error()}
	}
	var rule monitoringv1.PrometheusRule
	strict, err := kjson.UnmarshalStrict(asJSON, &rule)
	if err != nil {
		return []string{err.Error()}
	}
	var found []string
	for _, problem := range strict { // unknown or duplicate fields: the API server would drop them
		found = append(found, problem.Error())
	}
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" {
		found = append(found, fmt.Sprintf("not a monitoring.coreos.com/v1 PrometheusRule (%s %s)",
			rule.APIVersion, rule.Kind))
	}
	if len(rule.Spec.Groups) == 0 {
		found = append(found, "spec.groups is empty")
	}
	names := map[string]bool{}
	for g, group := range rule.Spec.Groups {
		where := fmt.Sprintf("spec.groups[%d] (%s)", g, group.Name)
		if group.Name == "" || names[group.Name] {
			found = append(found, where+": a group needs a name of its own")
		}
		names[group.Name] = true
		if group.Interval != nil {
			found = append(found, checkDuration(where+": interval", string(*group.Interval))...)
		}
		for r, item := range group.Rules {
			found = append(found, checkRule(fmt.Sprintf("%s.rules[%d]", where, r), item)...)
		}
	}
	return found
}

func checkRule(where string, rule monitoringv1.Rule) []string {
	var found []string
	if (rule.Alert == "") == (rule.Record == "") {
		found = append(found, where+": set exactly one of alert and record")
	}
	where += " (" + rule.Alert + rule.Record + ")"
	if rule.Record != "" && !model.UTF8Validation.IsValidMetricName(rule.Record) {
		found = append(found, where+": record is not a metric name")
	}
	expr := rule.Expr.String()
	if strings.TrimSpace(expr) == "" {
		found = append(found, where+": expr is empty")
	} else if _, err := parser.NewParser(parser.Options{}).ParseExpr(expr); err != nil {
		found = append(found, fmt.Sprintf("%s: expr: %v", where, err))
	}
	if rule.For != nil {
		found = append(found, checkDuration(where+": for", string(*rule.For))...)
	}
	for name, value := range rule.Labels {
		if !model.UTF8Validation.IsValidLabelName(name) || name == model.MetricNameLabel {
			found = append(found, fmt.Sprintf("%s: label name %q", where, name))
		}
		if !model.LabelValue(value).IsValid() {
			found = append(found, fmt.Sprintf("%s: label %s's value is not UTF-8", where, name))
		}
	}
	if rule.Alert != "" {
		if rule.Labels["severity"] == "" {
			found = append(found, where+": an alert needs a severity label (what routes it)")
		}
		if rule.Annotations["summary"] == "" {
			found = append(found, where+": an alert needs a summary annotation (what the page says)")
		}
	}
	return found
}

func checkDuration(where, value string) []string {
	if _, err := model.ParseDuration(value); err != nil {
		return []string{fmt.Sprintf("%s: %v", where, err)}
	}
	return nil
}

// -- helpers --------------------------------------------------------------------------------------

// lines splits the SDK's errors one per line. Its strict decoders return an empty cog.BuildErrors
// (a non-nil error value) when all is well: that is no problem.
func lines(err error) []string {
	var built cog.BuildErrors
	if errors.As(err, &built) {
		out := make([]string, 0, len(built))
		for _, one := range built {
			out = append(out, one.Error())
		}
		return out
	}
	if err != nil {
		return []string{err.Error()}
	}
	return nil
}

func prefixed(where string, found []string) []string {
	out := make([]string, 0, len(found))
	for _, problem := range found {
		out = append(out, where+": "+problem)
	}
	return out
}
