package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ephemeralhq/ephemeral/hostd/api/strictjson"
	"github.com/ephemeralhq/ephemeral/hostd/outputs"
	"github.com/ephemeralhq/ephemeral/hostd/runs"
	"github.com/ephemeralhq/ephemeral/hostd/webhook"
)

// Limits on a run request. The body cap bounds memory per request; the
// others keep one run's inputs reasonable for a microVM.
const (
	MaxBodyBytes      = 1 << 20
	MaxPromptChars    = 100_000
	MaxModelChars     = 200
	MaxFiles          = 32
	MaxFileBytes      = 256 << 10
	MaxFilesBytes     = 768 << 10
	MaxFilePathBytes  = 255
	MaxConnections    = 16
	MaxTimeoutSeconds = 3600
	DefaultTimeout    = 120
)

// runRequest is POST /v1/runs' body. Pointers tell "absent" from zero.
type runRequest struct {
	Prompt            *string             `json:"prompt"`
	Model             *string             `json:"model"`
	Shell             *bool               `json:"shell"`
	Web               *bool               `json:"web"`
	Connections       []connectionRequest `json:"connections"`
	Files             []fileRequest       `json:"files"`
	TimeoutSeconds    *int64              `json:"timeout_seconds"`
	MaxCostMicros     *int64              `json:"max_cost_micros"`
	ZeroDataRetention *bool               `json:"zero_data_retention"`
	Replay            *string             `json:"replay"`
	Outputs           []string            `json:"outputs"`
	WebhookURL        *string             `json:"webhook_url"`
}

type connectionRequest struct {
	Name    *string  `json:"name"`
	Methods []string `json:"methods"`
}

type fileRequest struct {
	Path     *string `json:"path"`
	Content  *string `json:"content"`
	Encoding *string `json:"encoding"`
	Mode     *string `json:"mode"`
}

// canonicalRequest is the request with defaults applied: two bodies that
// mean the same run encode to the same bytes, which is what idempotency
// compares and what is stored.
type canonicalRequest struct {
	Prompt            string            `json:"prompt"`
	Model             string            `json:"model"`
	Shell             bool              `json:"shell"`
	Web               bool              `json:"web"`
	Connections       []runs.Connection `json:"connections"`
	Files             []canonicalFile   `json:"files"`
	TimeoutSeconds    int64             `json:"timeout_seconds"`
	MaxCostMicros     int64             `json:"max_cost_micros"`
	ZeroDataRetention bool              `json:"zero_data_retention"`
	// Fields added later are omitted when unused, so requests that do
	// not use them encode (and hash for idempotency) as before.
	Replay     string   `json:"replay,omitempty"`
	Outputs    []string `json:"outputs,omitempty"`
	WebhookURL string   `json:"webhook_url,omitempty"`

	// data are the files' bytes, decoded; not part of the encoding.
	data [][]byte
}

// canonicalFile is an input file with its defaults left out: text content
// (no encoding) and mode 0644 (no mode).
type canonicalFile struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty"`
	Mode     string `json:"mode,omitempty"`
}

// Encodings of an input file's content.
const (
	encodingText   = "utf-8"
	encodingBase64 = "base64"
)

// requireJSON refuses a body sent as anything but JSON in UTF-8: what a
// client labels otherwise (a form, text) it did not mean as this API's
// request, and a browser sends a cross-site form without asking first.
func requireJSON(r *http.Request) *apiError {
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err == nil && mediaType == "application/json" {
		charset, named := params["charset"]
		delete(params, "charset")
		if len(params) == 0 && (!named || strings.EqualFold(charset, "utf-8")) {
			return nil
		}
	}
	return &apiError{Status: http.StatusUnsupportedMediaType, Type: invalidRequest, Code: "unsupported_media_type", Param: "Content-Type",
		Message: "the request body must be JSON, sent with Content-Type: application/json"}
}

// decodeStrict decodes the request body, exactly one JSON value, into v
// (a pointer): every key must be spelled exactly as one of v's fields and
// appear once (see strictjson), since a misspelt, differently cased or
// repeated permission must never be silently ignored or overridden. Wrong
// types and trailing data are rejected too, each naming the field.
func decodeStrict(r *http.Request, w http.ResponseWriter, v any) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		return decodeError(err)
	}
	return decodeBody(body, v)
}

// decodeBody is decodeStrict for a body already read.
func decodeBody(body []byte, v any) *apiError {
	if err := strictjson.Check(body, reflect.TypeOf(v)); err != nil {
		return decodeError(err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return decodeError(err)
	}
	return nil
}

func decodeError(err error) *apiError {
	var maxErr *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var keyErr *strictjson.KeyError
	switch {
	case errors.As(err, &maxErr):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Type: invalidRequest, Code: "body_too_large",
			Message: fmt.Sprintf("request body exceeds %d bytes", MaxBodyBytes)}
	case errors.As(err, &keyErr) && keyErr.Duplicate:
		return badParam(keyErr.Path, "duplicate_parameter", fmt.Sprintf("parameter %q is given more than once", keyErr.Path))
	case errors.As(err, &keyErr) && keyErr.Suggest != "":
		return badParam(keyErr.Path, "unknown_parameter",
			fmt.Sprintf("unknown parameter %q (names are case-sensitive: did you mean %q?)", keyErr.Path, keyErr.Suggest))
	case errors.As(err, &keyErr):
		return badParam(keyErr.Path, "unknown_parameter", fmt.Sprintf("unknown parameter %q", keyErr.Path))
	case errors.As(err, &typeErr):
		field := typeErr.Field
		return badParam(field, "parameter_invalid_type",
			fmt.Sprintf("%s must be %s, not JSON %s", field, jsonTypeName(typeErr.Type.String()), typeErr.Value))
	case errors.Is(err, strictjson.ErrTrailingData):
		return &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: "invalid_json",
			Message: "request body must hold exactly one JSON object"}
	case errors.Is(err, strictjson.ErrTooDeep):
		return &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: "invalid_json",
			Message: fmt.Sprintf("request body nests deeper than %d levels", strictjson.MaxDepth)}
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: "invalid_json",
			Message: "request body is not valid JSON: " + err.Error()}
	case errors.Is(err, io.EOF):
		return &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: "invalid_json",
			Message: "request body is empty"}
	}
	return &apiError{Status: http.StatusBadRequest, Type: invalidRequest, Code: "invalid_json", Message: err.Error()}
}

func jsonTypeName(goType string) string {
	switch {
	case strings.HasPrefix(goType, "*"):
		return jsonTypeName(goType[1:])
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "int"):
		return "an integer"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	}
	return "an object"
}

var (
	exampleName    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	connectionName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	httpMethods    = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true}
)

// validate checks ranges and shapes and applies defaults. A replay that
// names no model is left without one: it runs with its recording's
// (checkReplay fills it in).
func (req *runRequest) validate(lim limits) (canonicalRequest, *apiError) {
	c := canonicalRequest{TimeoutSeconds: DefaultTimeout, Connections: []runs.Connection{}, Files: []canonicalFile{}}
	switch {
	case req.Prompt == nil:
		return c, badParam("prompt", "parameter_missing", "prompt is required")
	case strings.TrimSpace(*req.Prompt) == "":
		return c, badParam("prompt", "parameter_invalid", "prompt must not be empty")
	case utf8.RuneCountInString(*req.Prompt) > MaxPromptChars:
		return c, badParam("prompt", "parameter_invalid", fmt.Sprintf("prompt exceeds %d characters", MaxPromptChars))
	}
	c.Prompt = *req.Prompt
	if req.Model != nil {
		if n := utf8.RuneCountInString(*req.Model); n == 0 || n > MaxModelChars {
			return c, badParam("model", "parameter_invalid", fmt.Sprintf("model must be a model name of 1 to %d characters", MaxModelChars))
		}
		c.Model = *req.Model
	}
	if req.Replay != nil {
		if !exampleName.MatchString(*req.Replay) {
			return c, badParam("replay", "parameter_invalid", "replay must name an example, e.g. \"product-page\"")
		}
		c.Replay = *req.Replay
	} else {
		if c.Model == "" {
			c.Model = lim.defaultModel
		}
		if c.Model == "" {
			return c, modelRequired(lim.usableModels())
		}
		// A replay's model answers from its recording: its provider need
		// not be configured. Any other run's must be, before anything is
		// reserved or booted.
		if lim.validateModel != nil {
			if err := lim.validateModel(c.Model); err != nil {
				return c, badParam("model", "model_not_available", err.Error())
			}
		}
	}
	c.Shell = req.Shell != nil && *req.Shell
	c.Web = req.Web != nil && *req.Web
	c.ZeroDataRetention = req.ZeroDataRetention != nil && *req.ZeroDataRetention
	if req.TimeoutSeconds != nil {
		if t := *req.TimeoutSeconds; t < 1 || t > MaxTimeoutSeconds {
			return c, badParam("timeout_seconds", "parameter_out_of_range",
				fmt.Sprintf("timeout_seconds must be between 1 and %d", MaxTimeoutSeconds))
		}
		c.TimeoutSeconds = *req.TimeoutSeconds
	}
	switch {
	case req.MaxCostMicros == nil:
		return c, badParam("max_cost_micros", "parameter_missing", "max_cost_micros is required: every run has a hard budget")
	case *req.MaxCostMicros < 1 || *req.MaxCostMicros > lim.maxCostMicros:
		return c, badParam("max_cost_micros", "parameter_out_of_range",
			fmt.Sprintf("max_cost_micros must be between 1 and %d", lim.maxCostMicros))
	}
	c.MaxCostMicros = *req.MaxCostMicros
	if err := validateConnections(req.Connections, &c); err != nil {
		return c, err
	}
	if err := validateFiles(req.Files, &c); err != nil {
		return c, err
	}
	if err := validateOutputs(req.Outputs, &c); err != nil {
		return c, err
	}
	if req.WebhookURL != nil {
		if _, err := webhook.ParseURL(*req.WebhookURL); err != nil {
			return c, badParam("webhook_url", "parameter_invalid", err.Error())
		}
		c.WebhookURL = *req.WebhookURL
	}
	return c, nil
}

// modelRequired refuses a request that names no model where no default
// is configured: the model is not guessed.
func modelRequired(usable []string) *apiError {
	e := badParam("model", "model_required", "")
	if len(usable) == 0 {
		e.Message = "model is required, and no model is usable: the daemon's operator must configure a model provider " +
			"(openai-api-key or openai-base-url, anthropic-api-key or anthropic-base-url)"
		return e
	}
	e.Message = fmt.Sprintf("model is required: this daemon has no default model (the default-model setting, "+
		"EPHEMERAL_DEFAULT_MODEL). Usable models: %s", strings.Join(usable, ", "))
	e.UsableModels = usable
	return e
}

// validateOutputs checks the patterns of the files to copy out when the
// run ends (package outputs says what a pattern may be).
func validateOutputs(patterns []string, c *canonicalRequest) *apiError {
	if len(patterns) > outputs.MaxPatterns {
		return badParam("outputs", "parameter_invalid", fmt.Sprintf("at most %d output patterns", outputs.MaxPatterns))
	}
	for i, p := range patterns {
		param := fmt.Sprintf("outputs[%d]", i)
		if msg := outputs.CheckPattern(p); msg != "" {
			return badParam(param, "parameter_invalid", msg)
		}
		if j := slices.Index(patterns[:i], p); j >= 0 {
			return badParam(param, "parameter_conflict", fmt.Sprintf("outputs[%d] and outputs[%d] are both %q", j, i, p))
		}
	}
	if len(patterns) > 0 { // "outputs": [] is the same run as none
		c.Outputs = patterns
	}
	return nil
}

// fileMode matches a file's mode as a request gives it: three or four
// octal digits.
var fileMode = regexp.MustCompile(`^[0-7]{3,4}$`)

// decodeFile checks an input file's content, encoding and mode and
// returns its bytes and its canonical form.
func decodeFile(f fileRequest, p string) (canonicalFile, []byte, *apiError) {
	cf := canonicalFile{Path: *f.Path, Content: *f.Content}
	data := []byte(*f.Content)
	switch {
	case f.Encoding == nil || *f.Encoding == encodingText:
	case *f.Encoding == encodingBase64:
		var err error
		if data, err = base64.StdEncoding.DecodeString(*f.Content); err != nil {
			return cf, nil, badParam(p+".content", "parameter_invalid", "content is not valid base64 (standard alphabet, padded)")
		}
		cf.Encoding, cf.Content = encodingBase64, base64.StdEncoding.EncodeToString(data)
	default:
		return cf, nil, badParam(p+".encoding", "parameter_invalid", `encoding must be "utf-8" (the default) or "base64"`)
	}
	if len(data) > MaxFileBytes {
		return cf, nil, badParam(p+".content", "parameter_invalid", fmt.Sprintf("file content exceeds %d bytes", MaxFileBytes))
	}
	if f.Mode != nil {
		if !fileMode.MatchString(*f.Mode) {
			return cf, nil, badParam(p+".mode", "parameter_invalid", `mode must be octal permission bits as a string, e.g. "0755"`)
		}
		m, _ := strconv.ParseUint(*f.Mode, 8, 32)
		switch {
		case m&^0o777 != 0:
			return cf, nil, badParam(p+".mode", "parameter_invalid", "mode may hold permission bits only: no setuid, setgid or sticky bit")
		case m&0o400 == 0:
			return cf, nil, badParam(p+".mode", "parameter_invalid", "mode must let the worker read its file (0400)")
		}
		if m != defaultFileMode {
			cf.Mode = fmt.Sprintf("%04o", m)
		}
	}
	return cf, data, nil
}

// defaultFileMode is the mode of an input file that names none.
const defaultFileMode = 0o644

func validateConnections(conns []connectionRequest, c *canonicalRequest) *apiError {
	if len(conns) > MaxConnections {
		return badParam("connections", "parameter_invalid", fmt.Sprintf("at most %d connections", MaxConnections))
	}
	seen := map[string]bool{}
	for i, conn := range conns {
		p := fmt.Sprintf("connections[%d]", i)
		if conn.Name == nil || !connectionName.MatchString(*conn.Name) {
			return badParam(p+".name", "parameter_invalid", "connection name must match "+connectionName.String())
		}
		if seen[*conn.Name] {
			return badParam(p+".name", "parameter_invalid", fmt.Sprintf("connection %q is listed twice", *conn.Name))
		}
		seen[*conn.Name] = true
		if len(conn.Methods) == 0 {
			return badParam(p+".methods", "parameter_missing", "methods must list the HTTP methods the run may use")
		}
		methods := map[string]bool{}
		for j, m := range conn.Methods {
			if !httpMethods[m] || methods[m] {
				return badParam(fmt.Sprintf("%s.methods[%d]", p, j), "parameter_invalid",
					"methods must be distinct, upper-case HTTP methods: GET, HEAD, POST, PUT, PATCH, DELETE")
			}
			methods[m] = true
		}
		c.Connections = append(c.Connections, runs.Connection{Name: *conn.Name, Methods: conn.Methods})
	}
	return nil
}

func validateFiles(files []fileRequest, c *canonicalRequest) *apiError {
	if len(files) > MaxFiles {
		return badParam("files", "parameter_invalid", fmt.Sprintf("at most %d files", MaxFiles))
	}
	total := 0
	byPath := map[string]int{} // a file's path to its index
	for i, f := range files {
		p := fmt.Sprintf("files[%d]", i)
		if f.Path == nil {
			return badParam(p+".path", "parameter_missing", "path is required")
		}
		if msg := checkRelativePath(*f.Path); msg != "" {
			return badParam(p+".path", "parameter_invalid", msg)
		}
		if j, ok := byPath[*f.Path]; ok {
			return badParam(p+".path", "parameter_conflict",
				fmt.Sprintf("files[%d].path and files[%d].path are both %q", j, i, *f.Path))
		}
		byPath[*f.Path] = i
		if f.Content == nil {
			return badParam(p+".content", "parameter_missing", "content is required")
		}
		cf, data, apiErr := decodeFile(f, p)
		if apiErr != nil {
			return apiErr
		}
		total += len(data)
		if total > MaxFilesBytes {
			return badParam(p+".content", "parameter_invalid", fmt.Sprintf("files exceed %d bytes in total", MaxFilesBytes))
		}
		c.Files = append(c.Files, cf)
		c.data = append(c.data, data)
	}
	// No file may sit inside another: "a" cannot be a file and the
	// directory of "a/b" at once, and writing them would fail in the VM,
	// after the boot has been paid for.
	for i, f := range c.Files {
		for dir := path.Dir(f.Path); dir != "."; dir = path.Dir(dir) {
			if j, ok := byPath[dir]; ok {
				return badParam(fmt.Sprintf("files[%d].path", i), "parameter_conflict",
					fmt.Sprintf("files[%d].path %q is a file, so files[%d].path %q cannot be inside it", j, dir, i, f.Path))
			}
		}
	}
	return nil
}

// checkRelativePath accepts only clean paths inside the scratch directory.
func checkRelativePath(p string) string {
	switch {
	case p == "" || len(p) > MaxFilePathBytes:
		return fmt.Sprintf("path must be 1 to %d bytes", MaxFilePathBytes)
	case !utf8.ValidString(p) || strings.ContainsAny(p, "\x00\\"):
		return "path must be valid UTF-8 without NUL or backslash"
	case strings.HasPrefix(p, "/"):
		return "path must be relative to the run's scratch directory"
	case path.Clean(p) != p || p == ".":
		return "path must be clean (no empty, '.' or trailing elements)"
	case p == ".." || strings.HasPrefix(p, "../") || strings.Contains(p, "/../"):
		return "path must not contain '..'"
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return "path must not contain control characters"
		}
	}
	return ""
}

func (c canonicalRequest) spec(orgID string) runs.Spec {
	files := make([]runs.File, len(c.Files))
	for i, f := range c.Files {
		files[i] = runs.File{Path: f.Path, Content: string(c.data[i]), Mode: defaultFileMode}
		if f.Mode != "" {
			m, _ := strconv.ParseUint(f.Mode, 8, 32) // checked by decodeFile
			files[i].Mode = uint32(m)
		}
	}
	return runs.Spec{
		OrgID: orgID, Prompt: c.Prompt, Model: c.Model, Shell: c.Shell, Web: c.Web,
		Connections: c.Connections, Files: files, Timeout: time.Duration(c.TimeoutSeconds) * time.Second,
		MaxCostMicros: c.MaxCostMicros, ZeroDataRetention: c.ZeroDataRetention, Replay: c.Replay,
		Outputs: c.Outputs, WebhookURL: c.WebhookURL,
	}
}

func (c canonicalRequest) encode() []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(c) // only strings, numbers and slices of them: cannot fail
	return bytes.TrimSpace(buf.Bytes())
}

// validIdempotencyKey bounds the header to printable ASCII.
func validIdempotencyKey(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}
