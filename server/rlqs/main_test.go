package rlqs

import (
	"testing"

	"go.uber.org/goleak"
)

// Every stream's goroutines end with the stream.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
