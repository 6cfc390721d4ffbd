# shellcheck shell=bash disable=SC2034  # sourced: its variables are the worker's
# The soak's faults (sourced by scripts/soak.d/worker.sh). A worker picks one for each run
# (pick_fault), sets up the conditions ones before the run (in the run's subshell:
# apply_env_fault), and strikes the signal ones at a random moment while it runs (strike).
# What each fault may turn a command's status into is `fault_statuses`: a status outside
# the command's expected ones and these is unexplained.
# Uses: TINY (a full tmpfs), MEMCG (a memory-limited cgroup directory per hierarchy, or empty).

# name weight; "none" most often, so that most runs also show the fault-free path holds
FAULTS="none:8 kill-corral:3 term-corral:2 kill-tenant:2 term-tenant:1 kill-keeper:1 term-keeper:1 kill-engine:1 enospc:1 emfile:1 memcg:1"

# weighted LIST: one name of "name:weight ..."
# weighted LIST: sets PICKED to one name of "name:weight ..." (no subshell: a worker
# picks twice per run)
weighted() {
	local total=0 pick e
	for e in $1; do total=$((total + ${e#*:})); done
	pick=$((RANDOM % total))
	for e in $1; do
		pick=$((pick - ${e#*:}))
		if [ "$pick" -lt 0 ]; then
			PICKED=${e%%:*}
			return
		fi
	done
}

# Runs in the run's subshell, before its commands.
apply_env_fault() {
	case $1 in
	enospc) export TMPDIR=$TINY ;;
	emfile) ulimit -n $((12 + RANDOM % 20)) ;;
	memcg) [ -n "$MEMCG" ] && echo "$BASHPID" >"$MEMCG/cgroup.procs" ;;
	esac
}

# Extra statuses a fault explains, comma-separated. 3 and 120 are corral's own refusals
# (a protection it could not set up, a sandbox that could not start) with their reason on
# stderr; a resource that ran out is 120, never 3 (lua/corral/transient.lua); 137/143 a SIGKILL/SIGTERM that reached the command or corral; 2 a session that
# no longer exists (its keeper killed), 120 an exec its keeper left before starting it.
fault_statuses() {
	case $1 in
	kill-corral | kill-tenant) echo 137 ;;
	term-corral | term-tenant) echo 143 ;;
	kill-keeper) echo 137,120,2 ;;
	kill-engine) echo 137 ;;
	term-keeper) echo 143,137,120,2 ;;
	enospc | emfile) echo 120 ;;
	memcg) echo 3,120,121,137 ;;
	esac
}

# The signal a fault sends (KILL or TERM), or nothing for the others.
signal_of() {
	case $1 in
	kill-*) echo KILL ;;
	term-*) echo TERM ;;
	esac
}

# Pids of the processes beneath RUN (read from /proc with builtins only: a strike must be
# quicker than the short runs it aims at) whose argv has MARK, named (or not) corral.
marked() {
	local mark=$2 want=$3 p kids comm args queue=("$1")
	while [ ${#queue[@]} -gt 0 ]; do
		p=${queue[0]}
		queue=("${queue[@]:1}")
		kids=
		read -r kids 2>/dev/null <"/proc/$p/task/$p/children"
		# shellcheck disable=SC2206
		queue+=($kids)
		read -r comm 2>/dev/null <"/proc/$p/comm" || continue
		mapfile -d '' args 2>/dev/null <"/proc/$p/cmdline"
		case " ${args[*]} " in *" $mark "*) ;; *) continue ;; esac
		# a child corral forks (a probe's) keeps corral's argv under another name: not the tenant;
		# corral is the front (exec) or corral-host (every other command, handed over)
		case $want:$comm:${args[0]##*/} in
		corral:corral:* | corral:corral-host:*) echo "$p" ;;
		tenant:corral:* | tenant:corral-host:* | tenant:bash:* | tenant:*:corral) ;;
		tenant:*) echo "$p" ;;
		esac
	done
}

# strike FAULT TAG RUN: after a random 0-200 ms, signals the fault's target in the run TAG
# as soon as it exists (while the run's subshell RUN lives); prints "landed" when a signal
# was delivered.
strike() {
	local fault=$1 tag=$2 run=$3 sig=KILL pids=
	case $fault in term-*) sig=TERM ;; kill-*) ;; *) return ;; esac
	sleep "0.$(printf %03d $((RANDOM % 200)))"
	while kill -0 "$run" 2>/dev/null; do
		case $fault in
		*-corral) pids=$(marked "$run" "soakmark-$tag" corral | head -1) ;;
		*-tenant)
			pids=$(marked "$run" "soakmark-$tag" tenant)
			# a session's command runs beneath its keeper, not beneath the exec client
			[ -n "$pids" ] || pids=$(pgrep -f -- "^sh -c .* soakmark-$tag\$")
			;;
		*-keeper) pids=$(pgrep -f -- "^corral-keeper soak-$tag( |\$)" | tail -1) ;;
		*-engine) pids=$(pgrep -x -f -- "podman .* soakmark-$tag") ;;
		esac
		if [ -n "$pids" ]; then
			# shellcheck disable=SC2086
			kill -s "$sig" $pids 2>/dev/null && echo landed
			return
		fi
		sleep 0.02
	done
}
