package web

import (
	"bytes"
	"html/template"
	"net/url"
	"strings"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/renderer"
	"github.com/yuin/goldmark/renderer/html"
	"github.com/yuin/goldmark/util"
)

// Model answers are written by a model that read hostile input (prompts,
// command output, web pages): their Markdown is rendered as a document and
// nothing more. Raw HTML, inline or as a block, is shown as the text it is;
// a link becomes one only to an absolute http(s) URL, and then it tells
// the browser to send no referrer, give the page no handle on this one and
// lend it no ranking (rel="noopener noreferrer nofollow"); any other link,
// and every image (which would load from anywhere), is shown as its text
// with the URL beside it. Goldmark's attribute syntax stays off, so no
// Markdown can set an attribute.
var markdown = goldmark.New(
	goldmark.WithExtensions(extension.GFM),
	goldmark.WithRendererOptions(
		renderer.WithNodeRenderers(util.Prioritized(safeRenderer{}, 100)),
		// Models break lines with single newlines and mean it.
		html.WithHardWraps(),
	),
)

// renderMarkdown renders an answer for a page.
func renderMarkdown(src string) template.HTML {
	var buf bytes.Buffer
	if err := markdown.Convert([]byte(src), &buf); err != nil {
		// Goldmark fails only on a failing writer; show the text.
		return template.HTML("<pre>" + template.HTMLEscapeString(src) + "</pre>")
	}
	return template.HTML(buf.String()) // produced by the renderers above
}

// safeRenderer overrides goldmark's renderers for the nodes that can carry
// markup or URLs.
type safeRenderer struct{}

func (safeRenderer) RegisterFuncs(reg renderer.NodeRendererFuncRegisterer) {
	reg.Register(ast.KindRawHTML, renderRawHTMLAsText)
	reg.Register(ast.KindHTMLBlock, renderHTMLBlockAsText)
	reg.Register(ast.KindLink, renderLink)
	reg.Register(ast.KindAutoLink, renderAutoLink)
	reg.Register(ast.KindImage, renderImage)
}

// linkRel is what every rendered link carries.
const linkRel = `rel="noopener noreferrer nofollow"`

// safeURL returns dest when it is an absolute http(s) URL.
func safeURL(dest []byte) (string, bool) {
	u, err := url.Parse(strings.TrimSpace(string(dest)))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false
	}
	return u.String(), true
}

func renderRawHTMLAsText(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkSkipChildren, nil
	}
	n := node.(*ast.RawHTML)
	for i := range n.Segments.Len() {
		seg := n.Segments.At(i)
		w.WriteString(template.HTMLEscapeString(string(seg.Value(source))))
	}
	return ast.WalkSkipChildren, nil
}

func renderHTMLBlockAsText(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	n := node.(*ast.HTMLBlock)
	w.WriteString("<pre>")
	for i := range n.Lines().Len() {
		line := n.Lines().At(i)
		w.WriteString(template.HTMLEscapeString(string(line.Value(source))))
	}
	if n.HasClosure() {
		w.WriteString(template.HTMLEscapeString(string(n.ClosureLine.Value(source))))
	}
	w.WriteString("</pre>\n")
	return ast.WalkSkipChildren, nil
}

func renderLink(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	n := node.(*ast.Link)
	href, ok := safeURL(n.Destination)
	if entering {
		if ok {
			w.WriteString(`<a href="` + template.HTMLEscapeString(href) + `" ` + linkRel + `>`)
		}
		return ast.WalkContinue, nil
	}
	if ok {
		w.WriteString("</a>")
	} else if len(n.Destination) > 0 {
		// The target is shown, not followed.
		w.WriteString(" (" + template.HTMLEscapeString(string(n.Destination)) + ")")
	}
	return ast.WalkContinue, nil
}

func renderAutoLink(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	n := node.(*ast.AutoLink)
	label := template.HTMLEscapeString(string(n.Label(source)))
	dest := n.URL(source)
	if n.AutoLinkType == ast.AutoLinkURL && !bytes.Contains(dest, []byte("://")) {
		dest = append([]byte("http://"), dest...) // www.example.org
	}
	if href, ok := safeURL(dest); ok {
		w.WriteString(`<a href="` + template.HTMLEscapeString(href) + `" ` + linkRel + `>` + label + `</a>`)
		return ast.WalkContinue, nil
	}
	w.WriteString(label)
	return ast.WalkContinue, nil
}

// renderImage shows an image as a link to it (or as its text): loading it
// would tell its server who reads the answer.
func renderImage(w util.BufWriter, source []byte, node ast.Node, entering bool) (ast.WalkStatus, error) {
	n := node.(*ast.Image)
	href, ok := safeURL(n.Destination)
	if entering {
		w.WriteString("[")
		if ok {
			w.WriteString(`<a href="` + template.HTMLEscapeString(href) + `" ` + linkRel + `>`)
		}
		return ast.WalkContinue, nil
	}
	if ok {
		w.WriteString("</a>")
	}
	w.WriteString("]")
	if !ok && len(n.Destination) > 0 {
		w.WriteString(" (" + template.HTMLEscapeString(string(n.Destination)) + ")")
	}
	return ast.WalkContinue, nil
}
