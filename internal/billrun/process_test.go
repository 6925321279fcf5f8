package billrun_test

func cleanupBinary() {}
