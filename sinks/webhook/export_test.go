package webhook

// Classify is the guard's verdict on an address, for tests of addresses the
// dialer itself would rewrite before the guard sees them.
var Classify = classify

// RetryAfter reads a Retry-After header at a given now.
var RetryAfter = retryAfter
