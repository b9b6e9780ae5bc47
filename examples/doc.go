// Package examples holds the storaged client examples, one per language
// (go/, node/, python/), and the test that runs each of them against a real
// storaged process and checks what it printed against the store
// (examples_test.go). See README.md.
package examples
