#!/usr/bin/env bash
# The soak inside its own world (pid 1 of a pid namespace, so orphans are reaped here;
# the network namespace and cgroup are scripts/bench/census.lua's run_private's): sets up
# the servers and the faults' conditions, takes the census, runs the workers with a census
# every minute, sweeps, takes the census again and tears the set-up down. Everything it
# writes is in $WORK: account, census-before.json, census-during-N.json, census-after.json,
# canary.log, swept.
# Usage: drive.sh   (environment: C, WORK, SECONDS_TO_RUN, WORKERS, STOP)
set -u
here=$(cd "$(dirname "$0")" && pwd)
export SRV_PORT=18080 UDP_PORT=18081 CANARY_PORT=18082
export TINY=$WORK/tiny GRANTS=$WORK/grants.lua ACCOUNT=$WORK/account CANARY_LOG=$WORK/canary.log
export DEADLINE=$(($(date +%s) + SECONDS_TO_RUN))
say() { echo "soak: $*" >&2; }
containers=
command -v podman >/dev/null && containers=containers
# the containers' image (with podman and corral-runtime beside corral): links to the
# host's /usr, which each container binds read-only
export RUNTIME IMAGE= RUNTIME_ROOT=/run/corral-runtime
RUNTIME=$(dirname "$C")/corral-runtime
[ -n "$containers" ] && [ -x "$RUNTIME" ] && IMAGE=localhost/corral-soak:$$
# through one file name, so that the census's own fd on it reads the same every time
census() { "$C" "$here/census.lua" "$TINY" $containers >"$WORK/census.json" && mv "$WORK/census.json" "$WORK/census-$1.json"; }

setup() {
	mkdir -p "$WORK"/{store,confine,st,problems} "$TINY"
	: >"$ACCOUNT"
	: >"$CANARY_LOG"
	echo 'return { read = { "/etc" } }' >"$GRANTS"
	# canary.soak.test for the tenant's denied name; a resolver that never answers
	{ cat /etc/hosts; echo "127.0.0.3 canary.soak.test"; } >"$WORK/hosts"
	printf 'nameserver 127.0.0.53\n' >"$WORK/resolv.conf"
	mount --bind "$WORK/hosts" /etc/hosts && mount --bind "$WORK/resolv.conf" /etc/resolv.conf || return
	mount -t tmpfs -o size=64k soak-tiny "$TINY" && dd if=/dev/zero of="$TINY/fill" bs=4k count=64 2>/dev/null
	local memory
	memory=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
	export MEMCG=
	if [ -n "$memory" ] && [ -d "/sys/fs/cgroup/memory$memory" ]; then
		MEMCG=/sys/fs/cgroup/memory$memory/soak-mem
		mkdir -p "$MEMCG" && echo $((48 << 20)) >"$MEMCG/memory.limit_in_bytes"
	fi
	if [ -n "$IMAGE" ]; then
		mkdir -p "$WORK"/rootfs/{usr,etc,proc,sys,dev,tmp}
		for l in bin lib lib64 sbin; do ln -s usr/$l "$WORK/rootfs/$l"; done
		tar -C "$WORK/rootfs" -c . | podman import - "$IMAGE" >/dev/null || { say "podman import failed"; return 1; }
	fi
	/usr/bin/python3 "$here/servers.py" $SRV_PORT $UDP_PORT $CANARY_PORT "$CANARY_LOG" >"$WORK/servers.out" 2>&1 &
	SERVERS=$!
	for _ in $(seq 50); do grep -q ready "$WORK/servers.out" && return; sleep 0.1; done
	say "servers did not start: $(cat "$WORK/servers.out")"
	return 1
}

# The canaries count: each reached once from here (4 lines), then the log emptied.
canary_control() {
	curl -s -m 1 http://127.0.0.1:$CANARY_PORT/ http://127.0.0.2:$SRV_PORT/ http://canary.soak.test:$SRV_PORT/ >/dev/null
	echo x | socat -t 0.1 - UDP:127.0.0.1:$CANARY_PORT
	for _ in $(seq 50); do
		if [ "$(wc -l <"$CANARY_LOG")" = 4 ]; then
			: >"$CANARY_LOG"
			return
		fi
		sleep 0.1
	done
	say "the canaries did not count their control connections: $(cat "$CANARY_LOG")"
	return 1
}

teardown() {
	[ -n "${SERVERS:-}" ] && kill "$SERVERS" 2>/dev/null && wait "$SERVERS" 2>/dev/null
	[ -n "${MEMCG:-}" ] && rmdir "$MEMCG" 2>/dev/null
	umount "$TINY" /etc/resolv.conf /etc/hosts 2>/dev/null
	[ -n "$IMAGE" ] && podman rmi -f "$IMAGE" >/dev/null 2>&1
}

# What a killed run or session left for the next corral to sweep: corral ls sweeps dead
# keepers' state, a run sweeps dead runs'; a session whose rm a kill skipped is removed.
sweep() {
	local id
	for id in $("$C" ls 2>/dev/null | awk '$1 ~ /^soak-/ {print $1}'); do
		"$C" rm "$id" >/dev/null 2>&1 && echo "$id" >>"$WORK/swept"
	done
	# a container whose engine client was killed may be left: the engine removes it (and
	# corral-runtime's delete ends its keeper)
	if [ -n "$IMAGE" ]; then
		for id in $(podman ps -a -q --filter ancestor="$IMAGE"); do
			podman rm -f -t 0 "$id" >/dev/null 2>&1 && echo "container $id" >>"$WORK/swept"
		done
		# a client killed mid-create can leave a container the engine has forgotten:
		# corral-runtime's state (and the delegate's) with no engine to delete it
		local known
		known=$(podman ps -a -q --no-trunc)
		for dir in "$RUNTIME_ROOT"/*/; do
			id=$(basename "$dir")
			[ -d "$dir" ] && ! grep -qx "$id" <<<"$known" || continue
			"$RUNTIME" --root "$RUNTIME_ROOT" delete --force "$id" >/dev/null 2>&1 &&
				echo "forgotten container $id" >>"$WORK/swept"
		done
	fi
	"$C" run -- /bin/true
	"$C" ls >/dev/null
}

trap 'touch "$STOP"' INT TERM
setup && canary_control || { teardown; exit 1; }
census before
say "$WORKERS workers for ${SECONDS_TO_RUN}s"
pids=
for w in $(seq "$WORKERS"); do
	"$here/worker.sh" "$w" &
	pids="$pids $!"
done
minute=0
next=$(($(date +%s) + 60))
while sleep 1; do
	alive=0
	for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
	[ $alive = 1 ] || break
	[ "$(date +%s)" -ge $next ] || continue
	next=$((next + 60))
	minute=$((minute + 1))
	census "during-$minute"
	say "minute $minute: $(wc -l <"$ACCOUNT") runs, $(wc -l <"$CANARY_LOG") canary connections"
done
# shellcheck disable=SC2086
wait $pids
echo $(($(date +%s) - DEADLINE + SECONDS_TO_RUN)) >"$WORK/elapsed"
sweep
census after
teardown
