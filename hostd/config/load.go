package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Inputs are where Load looks for values.
type Inputs struct {
	// Flags holds the settings given on the command line, by name.
	Flags map[string]string
	// Getenv is os.LookupEnv in the daemon.
	Getenv func(name string) (string, bool)
	// ReadFile is os.ReadFile in the daemon.
	ReadFile func(path string) ([]byte, error)
}

// Source says where a setting's value came from: "default", "file <path>",
// "env <VAR>" or "flag --<name>".
type Source string

// Loaded is the effective configuration and where each value came from.
type Loaded struct {
	Config Config
	// File is the configuration file read, if any.
	File    string
	Sources map[string]Source
}

// Load layers defaults, the configuration file, the environment and the
// flags, in that order, and validates the result. Every error names the
// setting and where its bad value came from.
func Load(in Inputs) (Loaded, error) {
	if in.Getenv == nil {
		in.Getenv = func(string) (string, bool) { return "", false }
	}
	l := Loaded{Config: Defaults(), Sources: map[string]Source{}}
	for _, s := range Settings {
		if s.field != nil {
			l.Sources[s.Name] = "default"
		}
	}
	path, pathFrom := in.Flags[ConfigFileSetting], Source("flag --"+ConfigFileSetting)
	if path == "" {
		path, _ = in.Getenv(Setting{Name: ConfigFileSetting}.Env())
		pathFrom = Source("env " + Setting{Name: ConfigFileSetting}.Env())
	}
	if path != "" {
		if in.ReadFile == nil {
			return Loaded{}, fmt.Errorf("config: %s set by %s, but nothing can read files here", path, pathFrom)
		}
		raw, err := in.ReadFile(path)
		if err != nil {
			return Loaded{}, fmt.Errorf("config: read the configuration file (%s): %w", pathFrom, err)
		}
		if err := l.applyFile(path, raw); err != nil {
			return Loaded{}, err
		}
		l.File, l.Sources[ConfigFileSetting] = path, pathFrom
	}
	for _, s := range Settings {
		if s.field == nil {
			continue
		}
		if v, ok := in.Getenv(s.Env()); ok {
			if err := setString(s.field(&l.Config), v); err != nil {
				return Loaded{}, fmt.Errorf("config: %s (env %s): %w", s.Name, s.Env(), err)
			}
			l.Sources[s.Name] = Source("env " + s.Env())
		}
	}
	for name, v := range in.Flags {
		s, ok := Lookup(name)
		if !ok {
			return Loaded{}, fmt.Errorf("config: flag --%s is not a setting", name)
		}
		if s.field == nil {
			continue
		}
		if err := setString(s.field(&l.Config), v); err != nil {
			return Loaded{}, fmt.Errorf("config: %s (flag --%s): %w", s.Name, s.Name, err)
		}
		l.Sources[s.Name] = Source("flag --" + s.Name)
	}
	if err := l.Config.Validate(); err != nil {
		return Loaded{}, err
	}
	return l, nil
}

// applyFile sets the values of a JSON object whose keys are setting names.
// Numbers are taken as written (no float64 round trip), durations are
// strings such as "720h", and an unknown key is an error: a misspelt
// setting must not silently keep its default.
func (l *Loaded) applyFile(path string, raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var values map[string]any
	if err := dec.Decode(&values); err != nil {
		return fmt.Errorf("config: parse %s: want one JSON object of settings: %w", path, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("config: parse %s: data after the JSON object", path)
	}
	for name, v := range values {
		s, ok := Lookup(name)
		if !ok {
			return fmt.Errorf("config: %s: unknown setting %q (see ephemeral serve --help)", path, name)
		}
		if s.field == nil {
			return fmt.Errorf("config: %s: %q names the file itself; set it by flag or %s", path, name, s.Env())
		}
		if err := setJSON(s.field(&l.Config), v); err != nil {
			return fmt.Errorf("config: %s: %s: %w", path, name, err)
		}
		l.Sources[name] = Source("file " + path)
	}
	return nil
}

// setString parses a flag's or a variable's text into the field.
func setString(field any, v string) error {
	switch p := field.(type) {
	case *string:
		*p = v
	case *int:
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 0)
		if err != nil {
			return fmt.Errorf("want an integer, got %q", v)
		}
		*p = int(n)
	case *int64:
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return fmt.Errorf("want an integer, got %q", v)
		}
		*p = n
	case *time.Duration:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("want a duration such as 90s, 15m or 720h, got %q", v)
		}
		*p = d
	default:
		panic(fmt.Sprintf("config: field of type %T", field))
	}
	return nil
}

// setJSON sets the field from a decoded JSON value of the matching type.
func setJSON(field any, v any) error {
	switch p := field.(type) {
	case *string:
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("want a string, got %s", jsonType(v))
		}
		*p = s
	case *int, *int64:
		num, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("want an integer, got %s", jsonType(v))
		}
		n, err := jsonInteger(num)
		if err != nil {
			return err
		}
		if ip, isInt := p.(*int); isInt {
			if n > math.MaxInt || n < math.MinInt {
				return fmt.Errorf("%s is out of range", num)
			}
			*ip = int(n)
		} else {
			*p.(*int64) = n
		}
	case *time.Duration:
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf(`want a duration string such as "90s" or "720h", got %s`, jsonType(v))
		}
		return setString(field, s)
	default:
		panic(fmt.Sprintf("config: field of type %T", field))
	}
	return nil
}

// jsonInteger accepts integers however JSON spells them (100000000, 1e8,
// 1.0e8) as long as the value is a whole number that fits in an int64.
func jsonInteger(num json.Number) (int64, error) {
	if n, err := num.Int64(); err == nil {
		return n, nil
	}
	f, err := num.Float64()
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, fmt.Errorf("want a whole number, got %s", num)
	}
	return int64(f), nil
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "a list"
	}
	return "an object"
}

// format writes a field's value the way a user would set it.
func format(field any) string {
	switch p := field.(type) {
	case *string:
		return *p
	case *int:
		return strconv.Itoa(*p)
	case *int64:
		return strconv.FormatInt(*p, 10)
	case *time.Duration:
		return formatDuration(*p)
	}
	panic(fmt.Sprintf("config: field of type %T", field))
}

// formatDuration drops Go's trailing zero units: 720h, not 720h0m0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Redacted stands in for a secret's value.
const Redacted = "<redacted>"

// Print writes the effective configuration: every setting, its value
// (secrets redacted) and where the value came from.
func (l Loaded) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tVALUE\tFROM")
	for _, s := range Settings {
		src, ok := l.Sources[s.Name]
		if !ok {
			continue // no configuration file
		}
		v := s.Value(&l.Config)
		if s.field == nil {
			v = l.File
		}
		switch {
		case s.Secret && v != "":
			v = Redacted
		case v == "":
			v = `""`
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, v, src)
	}
	return tw.Flush()
}
