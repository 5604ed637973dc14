#!/usr/bin/env bash
# The main job, from a fresh clone on Debian 12, as root: installs the
# dependencies, builds and installs cuinterpose (the plugin into CRIU's
# plugin directory, so plain `criu dump`/`criu restore` use it), then
# checkpoints and restores a job of 4 processes that share GPU memory
# (cuinterpose-example, installed with cuinterpose) and prints, side by side,
# the pids, addresses and checksums of every allocation before and after, and
# which are equal.
#
# With an NVIDIA GPU it runs on the real driver; without one, on the fake
# driver (test/fakecuda), which keeps "device" memory outside the processes.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

bash "$top/contrib/install-deps.sh"
cd "$top"
[ -x configure ] && [ configure -nt configure.ac ] || ./autogen.sh >/dev/null
mkdir -p build
cd build
[ -f Makefile ] || ../configure --quiet
make -j"$(nproc)" >/dev/null
make -j"$(nproc)" -C test check TESTS= >/dev/null # the subreaper (test/e2e/e2e_reaper), no tests
make install >/dev/null
ldconfig
echo "cuinterpose installed: $(command -v cuinterpose), plugin in /usr/lib/criu"

# PID 1 on some machines does not reap orphans, and a restore needs the
# dumped pids free: the job runs below a subreaper.
exec "$top/build/test/e2e/e2e_reaper" bash "$top/contrib/demo-job.sh" "$top/build"
