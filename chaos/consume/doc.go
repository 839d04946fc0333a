// Package consume holds the reliability scenarios of idem consume, the
// sidecar that reads a broker and POSTs each message to an HTTP handler
// in any language (docs/consume.md).
package consume
