// Package accounts is how people use Ephemeral from a browser: they
// register with an email and a password (getting their own organisation,
// with a starter balance and the example connections), sign in and out,
// and change their password.
//
// Passwords are stored only as argon2id hashes (see password.go). A
// signed-in browser holds a random session token in an HttpOnly,
// SameSite=Lax cookie; the database keeps only the token's SHA-256, so
// sessions are rows that every daemon on one database sees. A session
// ends when it has been idle too long or reaches its absolute age, when
// its user signs out, signs in again on that browser (the token is
// replaced) or changes the password (every other session ends).
//
// Failed sign-ins are limited per account and per client address, and
// registrations per address, in fixed windows counted in the database.
package accounts

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/mail"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/ephemeralhq/ephemeral/hostd/store"
)

// Errors a person can do something about; the web pages word them.
var (
	ErrInvalidEmail = errors.New("accounts: not an email address")
	ErrWeakPassword = errors.New("accounts: password too short or too long")
	ErrEmailTaken   = store.ErrEmailTaken
	// ErrBadCredentials covers an unknown email and a wrong password
	// alike: which one it was is not told.
	ErrBadCredentials = errors.New("accounts: wrong email or password")
	// ErrNoSession means the request carries no live session.
	ErrNoSession = errors.New("accounts: not signed in")
)

// ThrottledError refuses an attempt over a rate limit.
type ThrottledError struct {
	RetryAfter time.Duration
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("accounts: too many attempts; retry in %s", e.RetryAfter.Round(time.Second))
}

// Password length bounds, in bytes.
const (
	MinPasswordBytes = 8
	MaxPasswordBytes = 256
)

// Rate limits: attempts per window.
const (
	LimitWindow              = 15 * time.Minute
	SignInFailuresPerAccount = 5
	SignInFailuresPerAddress = 20
	RegistrationsPerAddress  = 10
)

// Config tunes the service.
type Config struct {
	// StarterCreditMicros is credited to every new organisation.
	StarterCreditMicros int64
	// IdleTimeout ends a session not used for this long (default 7 days).
	IdleTimeout time.Duration
	// MaxAge ends every session this long after sign-in (default 30 days).
	MaxAge time.Duration
	// Provision finishes a new organisation (registers the example
	// connections); a failure is logged, the registration stands.
	Provision func(ctx context.Context, orgID string) error
	// KDF defaults to DefaultParams.
	KDF    Params
	Logger *slog.Logger
}

// Service registers, signs in and resolves sessions.
type Service struct {
	store *store.Store
	cfg   Config
	log   *slog.Logger
	// kdf bounds concurrent password hashing: each takes KDF.MemoryKiB
	// and a core, and sign-in forms are public.
	kdf *semaphore.Weighted

	dummyOnce sync.Once
	dummy     string // a hash to check against for unknown emails
}

// New creates the service.
func New(st *store.Store, cfg Config) *Service {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 7 * 24 * time.Hour
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 30 * 24 * time.Hour
	}
	if cfg.KDF == (Params{}) {
		cfg.KDF = DefaultParams
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{store: st, cfg: cfg, log: cfg.Logger, kdf: semaphore.NewWeighted(int64(runtime.NumCPU()))}
}

// MaxAge is how long a session lasts at most; the cookie lasts as long.
func (s *Service) MaxAge() time.Duration { return s.cfg.MaxAge }

// NormalizeEmail checks an email address and returns it as stored:
// trimmed and in lower case.
func NormalizeEmail(email string) (string, error) {
	email = strings.ToLower(strings.TrimSpace(email))
	if len(email) < 3 || len(email) > 254 {
		return "", ErrInvalidEmail
	}
	addr, err := mail.ParseAddress(email)
	if err != nil || addr.Name != "" || addr.Address != email {
		return "", ErrInvalidEmail
	}
	_, domain, _ := strings.Cut(email, "@")
	if !strings.Contains(domain, ".") || strings.HasPrefix(domain, ".") || strings.HasSuffix(domain, ".") {
		return "", ErrInvalidEmail
	}
	return email, nil
}

func checkPasswordRules(password string) error {
	if len(password) < MinPasswordBytes || len(password) > MaxPasswordBytes {
		return ErrWeakPassword
	}
	return nil
}

// Register creates an account and signs it in, returning the new
// session's token. addr is the client's address, for the rate limit;
// previous is the browser's old session token, if any, which ends.
func (s *Service) Register(ctx context.Context, email, password, addr, previous string) (string, store.User, error) {
	email, err := NormalizeEmail(email)
	if err != nil {
		return "", store.User{}, err
	}
	if err := checkPasswordRules(password); err != nil {
		return "", store.User{}, err
	}
	now := time.Now()
	addrKey := "register-address:" + addr
	if err := s.checkLimit(ctx, now, addrKey, RegistrationsPerAddress); err != nil {
		return "", store.User{}, err
	}
	hash, err := s.hash(ctx, password)
	if err != nil {
		return "", store.User{}, err
	}
	u, err := s.store.CreateAccount(ctx, store.NewAccount{Email: email, PasswordHash: hash,
		StarterCredit: s.cfg.StarterCreditMicros, At: now})
	if err != nil {
		return "", store.User{}, err
	}
	if err := s.store.RecordAttempt(ctx, now, now.Add(-LimitWindow), addrKey); err != nil {
		s.log.Warn("count registration", "err", err)
	}
	if s.cfg.Provision != nil {
		if err := s.cfg.Provision(ctx, u.OrgID); err != nil {
			s.log.Error("provision new organisation", "org", u.OrgID, "err", err)
		}
	}
	token, err := s.newSession(ctx, u.ID, now, previous)
	return token, u, err
}

// SignIn checks an email and password and starts a session, ending the
// browser's previous one. Failures are counted per account and per
// address; over the limit the attempt is refused with a *ThrottledError
// before the password is even checked.
func (s *Service) SignIn(ctx context.Context, email, password, addr, previous string) (string, store.User, error) {
	now := time.Now()
	accountKey := "sign-in-account:" + strings.ToLower(strings.TrimSpace(email))
	addrKey := "sign-in-address:" + addr
	if err := s.checkLimit(ctx, now, accountKey, SignInFailuresPerAccount); err != nil {
		return "", store.User{}, err
	}
	if err := s.checkLimit(ctx, now, addrKey, SignInFailuresPerAddress); err != nil {
		return "", store.User{}, err
	}
	u, ok, err := s.verify(ctx, email, password)
	if err != nil {
		return "", store.User{}, err
	}
	if !ok {
		if err := s.store.RecordAttempt(ctx, now, now.Add(-LimitWindow), accountKey, addrKey); err != nil {
			return "", store.User{}, err
		}
		return "", store.User{}, ErrBadCredentials
	}
	if err := s.store.ClearAttempts(ctx, accountKey); err != nil {
		s.log.Warn("clear sign-in failures", "err", err)
	}
	// Sign-in is a good moment to let expired sessions go.
	if _, err := s.store.DeleteExpiredSessions(ctx, now, now.Add(-s.cfg.IdleTimeout)); err != nil {
		s.log.Warn("delete expired sessions", "err", err)
	}
	token, err := s.newSession(ctx, u.ID, now, previous)
	return token, u, err
}

// verify checks a password against the account of email. An unknown email
// costs the same hashing as a wrong password, so response times do not
// tell which emails have accounts. A hash made with old parameters is
// replaced.
func (s *Service) verify(ctx context.Context, email, password string) (store.User, bool, error) {
	if len(password) > MaxPasswordBytes {
		return store.User{}, false, nil
	}
	u, err := s.store.UserByEmail(ctx, strings.ToLower(strings.TrimSpace(email)))
	encoded := u.PasswordHash
	if errors.Is(err, store.ErrNotFound) {
		s.dummyOnce.Do(func() { s.dummy = hashPassword("not a password", s.cfg.KDF) })
		encoded = s.dummy
	} else if err != nil {
		return store.User{}, false, err
	}
	if err := s.kdf.Acquire(ctx, 1); err != nil {
		return store.User{}, false, err
	}
	ok, params, checkErr := checkPassword(encoded, password)
	s.kdf.Release(1)
	if checkErr != nil {
		return store.User{}, false, fmt.Errorf("accounts: password of %s: %w", u.ID, checkErr)
	}
	if !ok || u.ID == "" {
		return store.User{}, false, nil
	}
	if params != s.cfg.KDF {
		if hash, err := s.hash(ctx, password); err == nil {
			if err := s.store.SetPassword(ctx, u.ID, hash, time.Now()); err != nil {
				s.log.Warn("rehash password", "user", u.ID, "err", err)
			}
		}
	}
	return u, true, nil
}

func (s *Service) hash(ctx context.Context, password string) (string, error) {
	if err := s.kdf.Acquire(ctx, 1); err != nil {
		return "", err
	}
	defer s.kdf.Release(1)
	return hashPassword(password, s.cfg.KDF), nil
}

// checkLimit refuses when key has limit attempts in its current window.
func (s *Service) checkLimit(ctx context.Context, now time.Time, key string, limit int) error {
	n, started, err := s.store.Attempts(ctx, key, now.Add(-LimitWindow))
	if err != nil {
		return err
	}
	if n >= limit {
		return &ThrottledError{RetryAfter: max(time.Second, started.Add(LimitWindow).Sub(now))}
	}
	return nil
}

// SignOut ends the session of token.
func (s *Service) SignOut(ctx context.Context, token string) error {
	if token == "" {
		return nil
	}
	return s.store.DeleteSession(ctx, tokenHash(token))
}

// ChangePassword replaces the user's password after checking the current
// one, ends every other session of the user and replaces this one: it
// returns the new token.
func (s *Service) ChangePassword(ctx context.Context, u store.User, token, current, next string) (string, error) {
	if err := checkPasswordRules(next); err != nil {
		return "", err
	}
	if _, ok, err := s.verify(ctx, u.Email, current); err != nil {
		return "", err
	} else if !ok {
		return "", ErrBadCredentials
	}
	hash, err := s.hash(ctx, next)
	if err != nil {
		return "", err
	}
	now := time.Now()
	if err := s.store.SetPassword(ctx, u.ID, hash, now); err != nil {
		return "", err
	}
	if err := s.store.DeleteUserSessions(ctx, u.ID, nil); err != nil {
		return "", err
	}
	return s.newSession(ctx, u.ID, now, token)
}

// Session resolves a session token to its live session, or ErrNoSession.
// A session used again more than a minute after it was last recorded has
// its idle expiry restarted (one write a minute, not one per request).
func (s *Service) Session(ctx context.Context, token string) (store.Session, error) {
	if token == "" || len(token) > 100 {
		return store.Session{}, ErrNoSession
	}
	now := time.Now()
	h := tokenHash(token)
	sess, err := s.store.SessionByToken(ctx, h, now, now.Add(-s.cfg.IdleTimeout))
	if errors.Is(err, store.ErrNotFound) {
		return store.Session{}, ErrNoSession
	}
	if err != nil {
		return store.Session{}, err
	}
	if now.Sub(sess.LastSeenAt) > time.Minute {
		if err := s.store.TouchSession(ctx, h, now); err != nil {
			s.log.Warn("touch session", "err", err)
		}
	}
	return sess, nil
}

func (s *Service) newSession(ctx context.Context, userID string, now time.Time, previous string) (string, error) {
	raw := make([]byte, 32)
	rand.Read(raw)
	token := base64.RawURLEncoding.EncodeToString(raw)
	var replacing []byte
	if previous != "" {
		replacing = tokenHash(previous)
	}
	if err := s.store.CreateSession(ctx, tokenHash(token), userID, now, now.Add(s.cfg.MaxAge), replacing); err != nil {
		return "", err
	}
	return token, nil
}

func tokenHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}
