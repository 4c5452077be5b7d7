package main

import (
	"net/url"
	"strings"
)

// redactErr makes sure err's text repeats neither the connection string nor
// its password: pgx's parse errors can quote the string they failed on.
func redactErr(err error, connString string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	secrets := []string{connString}
	if u, perr := url.Parse(connString); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			secrets = append(secrets, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
	}
	for _, f := range strings.Fields(connString) { // key=value form
		if k, v, ok := strings.Cut(f, "="); ok && k == "password" && v != "" {
			secrets = append(secrets, strings.Trim(v, "'"))
		}
	}
	changed := false
	for _, s := range secrets {
		if s != "" && strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
			changed = true
		}
	}
	if !changed {
		return err
	}
	return &redacted{msg: msg, err: err}
}

// redactSecret hides one secret in err's text.
func redactSecret(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	return &redacted{msg: strings.ReplaceAll(err.Error(), secret, "[redacted]"), err: err}
}

// redacted keeps the original error for errors.Is and errors.As while
// showing only the cleaned text.
type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
