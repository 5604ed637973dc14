# A preloaded child that never initialized CUDA (Python's resource tracker)
# is an ordinary process to the plugin: two dump + restore cycles pass, one
# debug line names it, it gets no native checkpoint, and afterwards it
# still works and can begin CUDA (and then joins the next checkpoint).
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

start_proc 3
IDLE=$(rank_pid 2)
cmd 3 verify 0
before=$(answers 3)
for c in 1 2; do
	note "cycle $c"
	criu_dump "$T/d$c" || fail "criu dump with a preloaded child that never used CUDA"
	has_line "$T/d$c/dump.log" "pid $IDLE \(e2e_proc\) maps the interposer but has not initialized CUDA: an ordinary process" \
		"the ordinary process is not named"
	has_line "$T/d$c/dump.log" "2 participants, 2 CUDA processes, 1 with the interposer but no CUDA" \
		"wrong participant count"
	grep -q "holds no listening control socket" "$T/d$c/dump.log" && fail "refused the ordinary process"
	grep -qE "pid $IDLE is a CUDA process" "$T/d$c/dump.log" && fail "native checkpoint for a process without CUDA"
	wait_gone $(job_pids) || fail "the dumped job did not exit"
	criu_restore "$T/d$c" || fail "criu restore $c"
	has_line "$T/d$c/restore.log" "pid $IDLE \(e2e_proc\) maps the interposer but had not initialized CUDA" \
		"restore does not name the ordinary process"
	cmd 3 verify $((c - 1))
	[ "$(answers 3)" = "$before" ] || fail "answers changed: $(answers 3)"
	cmd 3 write 0 $c
	cmd 3 verify $c
done
note "the child begins CUDA after two restores"
cmd 3 cuda 2 2
cmd 3 verify 2
criu_dump "$T/d3" --leave-running || fail "criu dump once the child uses CUDA"
has_line "$T/d3/dump.log" "3 participants, 3 CUDA processes, 0 with the interposer but no CUDA" \
	"the child did not join as a participant"
cmd 3 write 2 7
cmd 3 verify 7
cmd 3 exit
note done
