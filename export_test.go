package idem

// RepeatUnknown exposes repeatUnknown to the external tests.
var RepeatUnknown = repeatUnknown
