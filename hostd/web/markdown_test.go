package web

import (
	"strings"
	"testing"
)

func TestMarkdownRendersHostileInputInert(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string // in the output
		never     []string
	}{
		{"inline script", "Look: <script>alert(1)</script> done",
			[]string{"&lt;script&gt;alert(1)&lt;/script&gt;"}, []string{"<script"}},
		{"html block", "<img src=x onerror=alert(2)>\n\nafter",
			[]string{"&lt;img src=x onerror=alert(2)&gt;", "<p>after</p>"}, []string{"<img"}},
		{"javascript link", "[click](javascript:alert(3))",
			[]string{"click (javascript:alert(3))"}, []string{"<a", "href"}},
		{"data link", "[x](data:text/html;base64,PHNjcmlwdD4=)", []string{"x (data:"}, []string{"<a"}},
		{"relative link", "[x](/account/keys)", []string{"x (/account/keys)"}, []string{"<a"}},
		{"http link", `[docs](https://example.org/a?b=1&c="2")`,
			[]string{`<a href="https://example.org/a?b=1&amp;c=&#34;2&#34;" rel="noopener noreferrer nofollow">docs</a>`}, nil},
		{"autolink", "see <https://example.org/x> and www.example.com",
			[]string{`<a href="https://example.org/x" rel="noopener noreferrer nofollow">https://example.org/x</a>`,
				`<a href="http://www.example.com" rel="noopener noreferrer nofollow">www.example.com</a>`}, nil},
		{"autolink javascript", "<javascript:alert(4)>", nil, []string{"<a", "href"}},
		{"image", "![logo](https://tracker.example/p.gif)",
			[]string{`[<a href="https://tracker.example/p.gif" rel="noopener noreferrer nofollow">logo</a>]`}, []string{"<img"}},
		{"attribute syntax", "# Title {onclick=alert(5)}", []string{"{onclick=alert(5)}"}, []string{" onclick"}},
		{"markdown still works", "1. **bold** and `code`\n2. two", []string{"<ol>", "<strong>bold</strong>", "<code>code</code>"}, nil},
	} {
		got := string(renderMarkdown(tc.src))
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, got)
			}
		}
		for _, n := range tc.never {
			if strings.Contains(got, n) {
				t.Errorf("%s: output holds %q:\n%s", tc.name, n, got)
			}
		}
	}
}
