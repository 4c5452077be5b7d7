// Package faults holds Kairos's fault-injection tests for processes and
// servers; it has no code of its own but this comment.
package faults
