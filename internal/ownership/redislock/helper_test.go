package redislock_test

// helperMain runs the test binary as a helper process when asked to (the
// crash test); it reports whether it did.
func helperMain() bool { return false }
