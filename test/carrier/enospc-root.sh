#!/bin/sh
# The carrier tests that need root (test_pipeline --needs-root: ENOSPC on a
# full tmpfs mounted in a private mount namespace); exit 77 without root.
exec ./test_pipeline --needs-root
