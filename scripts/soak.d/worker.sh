#!/usr/bin/env bash
# One soak worker: until DEADLINE (epoch seconds) or STOP exists, picks a workload and a
# fault, runs it, and appends its account line to $ACCOUNT:
#   TAG WORKLOAD FAULT LANDED SECONDS VERDICT CMD=STATUS[/EXPECTED]... | REASON
# VERDICT: ok (every status expected), explained (a status the fault explains), hung (past
# its wall limit plus GRACE: killed by the watchdog), lost (the kept storage's blob does
# not check, or lacks what a completed run wrote) or unexplained.
# Usage: worker.sh N   (environment: see scripts/soak.d/drive.sh)
set -u
W=$1
here=$(dirname "$0")
# shellcheck source=scripts/soak.d/workloads.sh
. "$here/workloads.sh"
# shellcheck source=scripts/soak.d/chaos.sh
. "$here/chaos.sh"
STORE=$WORK/store/w$W
CONFINE_DIR=$WORK/confine/w$W
mkdir -p "$CONFINE_DIR"
ST=$WORK/st/w$W
LIMIT=${SOAK_RUN_LIMIT:-20}

# The blob in the kept storage checks (its last line the sum of the others): prints its
# size when it does not.
storage_lost() {
	local blob=$STORE/blob
	[ -f "$blob" ] || return 0
	[ "$(head -n -1 "$blob" | sha256sum | cut -c1-64)" = "$(tail -n 1 "$blob")" ] || stat -c %s "$blob"
}

# verdict FAULT: reads $ST, prints the verdict and the statuses
verdict() {
	local fault=$1 extra v=ok cmd status expected line=
	extra=$(fault_statuses "$fault")
	while read -r cmd status expected; do
		line="$line $cmd=$status"
		case ",$expected," in *",$status,"*) continue ;; esac
		line="$line/$expected"
		case ",$extra," in
		*",$status,"*) [ $v = ok ] && v=explained ;;
		*)
			# a signal that hit a process corral made for the run (a probe's child), which
			# corral names: its 120 is that fault's
			if [ "$status" = 120 ] && [ -n "$(signal_of "$fault")" ] && grep -q "killed by signal" "$ST.err"; then
				[ $v = ok ] && v=explained
			else
				v=unexplained
			fi
			;;
		esac
	done <"$ST"
	echo "$v$line"
}

seq=0
# EPOCHSECONDS, EPOCHREALTIME: no fork per run for the clock
while [ "$EPOCHSECONDS" -lt "$DEADLINE" ] && [ ! -e "$STOP" ]; do
	seq=$((seq + 1))
	tag=w$W-$seq
	weighted "$WORKLOADS"
	wl=$PICKED
	weighted "$FAULTS"
	fault=$PICKED
	# ENOSPC, EMFILE and a memory limit would test podman's own handling, not corral's
	case $wl:$fault in container:enospc | container:emfile | container:memcg) fault=none ;; esac
	: >"$ST"
	start=${EPOCHREALTIME/./}
	(
		apply_env_fault "$fault"
		"wl_$wl" "$tag"
	) 2>"$ST.err" &
	run=$!
	(
		trap 'kill $nap; exit' TERM
		sleep "$LIMIT" &
		nap=$!
		wait $nap
		kill -0 "$run" && touch "$ST.hung" && pkill -KILL -f -- "soakmark-$tag|soak-$tag" && kill -KILL "$run"
	) 2>/dev/null &
	dog=$!
	landed=-
	if [ "$fault" != none ]; then landed=$(strike "$fault" "$tag" "$run") || true; fi
	wait "$run"
	kill "$dog" 2>/dev/null
	wait "$dog" 2>/dev/null
	ms=$(((${EPOCHREALTIME/./} - start) / 1000))
	secs=$((ms / 1000)).$(printf %03d $((ms % 1000)))
	v=$(verdict "$fault")
	if [ -e "$ST.hung" ]; then
		v="hung${v#* }"
		rm -f "$ST.hung"
	fi
	if [ "$wl" = storage ]; then
		lost=$(storage_lost)
		if [ -n "$lost" ]; then
			v="lost $lost bytes${v#* }"
		elif grep -q '^run-storage 0 ' "$ST" && [ "$(tail -n 1 "$STORE/blob")" != "$(tail -n 1 "$ST.sum")" ]; then
			v="lost $(stat -c %s "$STORE/blob") bytes (a completed run's blob is not there)${v#* }"
		fi
	fi
	case $v in ok* | explained*) ;; *) cp "$ST.err" "$WORK/problems/$tag.err" ;; esac
	reason=
	[ -s "$ST.err" ] && reason=$(grep -m1 -E '^corral[ a-z]*: ' "$ST.err" | cut -c1-160)
	echo "$tag $wl $fault ${landed:--} $secs $v | $reason" >>"$ACCOUNT"
done
