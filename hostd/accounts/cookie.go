package accounts

import (
	"context"
	"net/http"

	"github.com/ephemeralhq/ephemeral/hostd/forwarded"
)

// CookieName is the session cookie's name.
const CookieName = "ephemeral_session"

// TokenFrom returns the session token the request's cookie carries, or "".
func TokenFrom(r *http.Request) string {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return ""
	}
	return c.Value
}

// SetCookie gives the browser its session token: HttpOnly (no script
// reads it), SameSite=Lax (other sites' pages cannot make the browser
// send it with their forms or fetches), Secure when the request came over
// TLS (directly, or to a trusted proxy: package forwarded), and lasting as long as the session can.
func (s *Service) SetCookie(w http.ResponseWriter, r *http.Request, token string) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: token, Path: "/", MaxAge: int(s.cfg.MaxAge.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: forwarded.Secure(r)})
}

// ClearCookie removes the session cookie.
func ClearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: forwarded.Secure(r)})
}

// SessionOrg resolves the request's session cookie to the signed-in
// user's organisation, or ErrNoSession: how the API accepts browsers.
func (s *Service) SessionOrg(ctx context.Context, r *http.Request) (string, error) {
	sess, err := s.Session(ctx, TokenFrom(r))
	if err != nil {
		return "", err
	}
	return sess.User.OrgID, nil
}

// HasSessionCookie reports whether the request carries a session cookie
// at all (live or not).
func HasSessionCookie(r *http.Request) bool { return TokenFrom(r) != "" }
