package webhook

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// redactor is the one home of keeping a URL's secrets out of what the sink
// says: errors, log lines and park reasons show the URL without its
// credentials and with its query's values replaced, and any text that came
// from elsewhere (a receiver's answer, a transport error) has every such
// secret cut out before it is shown.
type redactor struct {
	secrets []string // the URL's password, user name, basic-auth form and query values
}

// redacted replaces a secret wherever it appears.
const redacted = "[redacted]"

func newRedactor(u *url.URL) redactor {
	var r redactor
	add := func(s string) {
		if s == "" {
			return
		}
		r.secrets = append(r.secrets, s)
		if e := url.QueryEscape(s); e != s {
			r.secrets = append(r.secrets, e)
		}
	}
	if u.User != nil {
		add(u.User.Username())
		p, ok := u.User.Password()
		if ok {
			add(p)
		}
		// The credentials as the Authorization header carries them, which
		// a receiver may repeat in its answer as readily as the URL.
		add(base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + p)))
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			add(v)
		}
	}
	if u.RawQuery != "" {
		add(u.RawQuery)
	}
	return r
}

// url shows u without credentials, its query's values redacted.
func (r redactor) url(u *url.URL) string {
	v := *u
	v.User = nil
	if v.RawQuery != "" {
		q := v.Query()
		for k := range q {
			q[k] = []string{"x"}
		}
		v.RawQuery = strings.ReplaceAll(q.Encode(), "=x", "="+redacted)
	}
	v.Fragment, v.RawFragment = "", ""
	return v.String()
}

// text cuts every secret out of s.
func (r redactor) text(s string) string {
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, redacted)
	}
	return s
}

// err replaces err by one whose text holds no secret: a *url.Error (which
// repeats the request's URL) shows the redacted URL, and any other text is
// cut by text. It keeps the chain for errors.Is where it can.
func (r redactor) err(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	if clean := r.text(msg); clean != msg {
		return errors.New(clean)
	}
	return err
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

func itoa(i int) string { return strconv.Itoa(i) }
