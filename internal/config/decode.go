package config

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"
)

// Error is one mistake in a configuration file: where it is, by the dotted
// path of keys that leads to it and by line and column, and what is wrong.
// Messages never repeat a free-text value (it may be a password or a token
// expanded from the environment); they name the key and say what was wanted.
type Error struct {
	File   string
	Path   string
	Line   int
	Column int
	Msg    string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:%d: ", e.Line, e.Column)
	} else if e.File != "" {
		b.WriteByte(' ')
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors are every mistake found in one file, in the order of the file.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Raw keeps a part of the file undecoded, with where it came from, for a
// decoder chosen later (a sink's options, decoded once its type is known).
type Raw struct {
	Node ast.Node
	Path string
}

// decoder walks the file's syntax tree beside a Go value, collecting every
// error instead of stopping at the first, so one run of `config check`
// lists them all.
type decoder struct {
	file   string
	errs   Errors
	nodes  map[string]ast.Node // every decoded value's node, by path, for later checks
	expand func(path string, n ast.Node, s string) (string, bool)
}

func (d *decoder) fail(path string, n ast.Node, format string, args ...any) {
	e := &Error{File: d.file, Path: path, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		if t := n.GetToken(); t != nil && t.Position != nil {
			e.Line, e.Column = t.Position.Line, t.Position.Column
		}
	}
	d.errs = append(d.errs, e)
}

// failed says whether an error was reported at path already.
func (d *decoder) failed(path string) bool {
	return slices.ContainsFunc(d.errs, func(e *Error) bool { return e.Path == path })
}

// unwrap looks through anchors and tags to the node that holds the value.
func unwrap(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		case *ast.DocumentNode:
			n = v.Body
		default:
			return n
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kind(n ast.Node) string {
	switch n.(type) {
	case nil, *ast.NullNode:
		return "nothing"
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.StringNode, *ast.LiteralNode:
		return "a string"
	case *ast.IntegerNode:
		return "a number"
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "a number"
	case *ast.BoolNode:
		return "a boolean"
	case *ast.AliasNode:
		return "an alias"
	}
	return "a " + n.Type().String()
}

// mapping returns the key/value pairs of a mapping node, or nil and an
// error when n is something else.
func (d *decoder) mapping(path string, n ast.Node) ([]*ast.MappingValueNode, bool) {
	switch m := unwrap(n).(type) {
	case *ast.MappingNode:
		return m.Values, true
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{m}, true
	case *ast.NullNode, nil:
		return nil, true
	default:
		d.fail(path, n, "is %s; want a mapping of keys to values", kind(m))
		return nil, false
	}
}

// scalar returns the text of a scalar node, after ${ENV} expansion for
// strings. quoted says the file wrote it as a string.
func (d *decoder) scalar(path string, n ast.Node) (text string, isString, ok bool) {
	switch v := unwrap(n).(type) {
	case *ast.StringNode:
		s, ok := d.expand(path, v, v.Value)
		return s, true, ok
	case *ast.LiteralNode:
		s, ok := d.expand(path, v, v.Value.Value)
		return s, true, ok
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		return v.GetToken().Value, false, true
	default:
		d.fail(path, n, "is %s; want a single value", kind(v))
		return "", false, false
	}
}

var durationType = reflect.TypeOf(time.Duration(0))
var rawType = reflect.TypeOf(Raw{})

// field is one settable key of a struct: its name in the file, and whether
// it must be there.
type field struct {
	name     string
	index    int
	required bool
	key      bool // the struct's name: the key it sits under in its parent
	rest     bool // a Raw that takes the whole mapping, unknown keys and all
}

func fields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("yaml")
		if !ok || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		fl := field{name: name, index: i}
		for _, o := range strings.Split(opts, ",") {
			switch o {
			case "required":
				fl.required = true
			case "key":
				fl.key = true
			case "rest":
				fl.rest = true
			}
		}
		out = append(out, fl)
	}
	return out
}

// decode fills v (addressable) from n. It knows strings, booleans, ints,
// durations, lists, structs with yaml tags, Raw, and mappings into a slice
// of structs whose key field takes each entry's name (so a file's order is
// kept).
func (d *decoder) decode(path string, n ast.Node, v reflect.Value) {
	if alias, ok := unwrap(n).(*ast.AliasNode); ok {
		d.fail(path, alias, "aliases are not supported; write the value out")
		return
	}
	if d.nodes != nil {
		d.nodes[path] = n
	}
	t := v.Type()
	switch {
	case t == rawType:
		v.Set(reflect.ValueOf(Raw{Node: n, Path: path}))
	case t == durationType:
		text, isString, ok := d.scalar(path, n)
		if !ok {
			return
		}
		dur, err := time.ParseDuration(text)
		switch {
		case err != nil && !isString:
			d.fail(path, n, "is %s; want a duration with its unit, like 30s or 1m30s", text)
		case err != nil:
			d.fail(path, n, "is not a duration; want one with its unit, like 30s or 1m30s")
		case dur < 0:
			d.fail(path, n, "is %v; durations must not be negative", dur)
		default:
			v.SetInt(int64(dur))
		}
	case t.Kind() == reflect.String:
		text, isString, ok := d.scalar(path, n)
		if !ok {
			return
		}
		// A bare number or boolean where text is wanted is taken as
		// written: `password: 1234` means the text 1234.
		_ = isString
		v.SetString(text)
	case t.Kind() == reflect.Bool:
		text, _, ok := d.scalar(path, n)
		if !ok {
			return
		}
		b, err := strconv.ParseBool(text)
		if err != nil {
			d.fail(path, n, "is not true or false")
			return
		}
		v.SetBool(b)
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		text, _, ok := d.scalar(path, n)
		if !ok {
			return
		}
		i, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			d.fail(path, n, "is not a whole number")
			return
		}
		v.SetInt(i)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct && hasKey(t.Elem()):
		pairs, ok := d.mapping(path, n)
		if !ok {
			return
		}
		out := reflect.MakeSlice(t, 0, len(pairs))
		seen := map[string]bool{}
		for _, p := range pairs {
			name, ok := d.key(path, p)
			if !ok {
				continue
			}
			if seen[name] {
				d.fail(join(path, name), p.Key, "is defined twice")
				continue
			}
			seen[name] = true
			if d.nodes != nil {
				d.nodes[join(path, name)] = p.Key
			}
			e := reflect.New(t.Elem()).Elem()
			for _, f := range fields(t.Elem()) {
				if f.key {
					e.Field(f.index).SetString(name)
				}
			}
			d.decodeStruct(join(path, name), p.Value, e)
			out = reflect.Append(out, e)
		}
		v.Set(out)
	case t.Kind() == reflect.Slice:
		seq, ok := unwrap(n).(*ast.SequenceNode)
		if !ok {
			if _, null := unwrap(n).(*ast.NullNode); null {
				return
			}
			d.fail(path, n, "is %s; want a list", kind(unwrap(n)))
			return
		}
		out := reflect.MakeSlice(t, len(seq.Values), len(seq.Values))
		for i, item := range seq.Values {
			d.decode(fmt.Sprintf("%s[%d]", path, i), item, out.Index(i))
		}
		v.Set(out)
	case t.Kind() == reflect.Struct:
		d.decodeStruct(path, n, v)
	default:
		panic(fmt.Sprintf("config: no decoding for %v", t))
	}
}

func hasKey(t reflect.Type) bool {
	return slices.ContainsFunc(fields(t), func(f field) bool { return f.key })
}

// key returns a mapping entry's key as text.
func (d *decoder) key(path string, p *ast.MappingValueNode) (string, bool) {
	switch k := unwrap(p.Key).(type) {
	case *ast.StringNode:
		return k.Value, true
	case *ast.IntegerNode, *ast.BoolNode, *ast.FloatNode:
		return k.GetToken().Value, true
	case *ast.MergeKeyNode:
		d.fail(path, p.Key, "merge keys (<<) are not supported; write the keys out")
	default:
		d.fail(path, p.Key, "has a key that is %s; keys are names", kind(k))
	}
	return "", false
}

// decodeStruct fills a struct's tagged fields from a mapping, refusing keys
// it does not know (with the nearest known one as a suggestion) and naming
// each required key that is missing. A Raw field tagged `yaml:",rest"`
// takes the whole mapping, minus the known keys' checks, for a later
// decoder.
func (d *decoder) decodeStruct(path string, n ast.Node, v reflect.Value) {
	pairs, ok := d.mapping(path, n)
	if !ok {
		return
	}
	fs := fields(v.Type())
	rest := -1
	var names []string
	for _, f := range fs {
		if f.rest {
			rest = f.index
		}
		if f.name != "" && !f.key {
			names = append(names, f.name)
		}
	}
	seen := map[string]bool{}
	for _, p := range pairs {
		name, ok := d.key(path, p)
		if !ok {
			continue
		}
		if seen[name] {
			d.fail(join(path, name), p.Key, "is set twice")
			continue
		}
		seen[name] = true
		i := slices.IndexFunc(fs, func(f field) bool { return f.name == name && name != "" })
		if i < 0 {
			if rest >= 0 {
				continue
			}
			msg := "is not a known key"
			if s := suggest(name, names); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			} else if len(names) > 0 {
				sorted := slices.Clone(names)
				sort.Strings(sorted)
				msg += "; known keys: " + strings.Join(sorted, ", ")
			}
			d.fail(join(path, name), p.Key, "%s", msg)
			continue
		}
		fv := v.Field(fs[i].index)
		d.decode(join(path, name), p.Value, fv)
		// A required string set to "" is as missing as one left out: a
		// sink's type, a database URL, a sink's server.
		if fs[i].required && fv.Kind() == reflect.String && fv.String() == "" && !d.failed(join(path, name)) {
			d.fail(join(path, name), p.Value, "is empty")
		}
	}
	if rest >= 0 {
		v.Field(rest).Set(reflect.ValueOf(Raw{Node: n, Path: path}))
	}
	for _, f := range fs {
		if f.required && !seen[f.name] {
			d.fail(join(path, f.name), n, "is required")
		}
	}
}

// suggest returns the known name closest to name, if it is close enough to
// be a typo: at most a third of its letters off, and never more than 3.
func suggest(name string, known []string) string {
	best, bestD := "", 0
	for _, k := range known {
		dist := levenshtein(strings.ToLower(name), strings.ToLower(k))
		if best == "" || dist < bestD {
			best, bestD = k, dist
		}
	}
	if best == "" || bestD > min(3, max(1, len(name)/3)) {
		return ""
	}
	return best
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
