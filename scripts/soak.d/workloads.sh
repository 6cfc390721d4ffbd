# shellcheck shell=bash disable=SC2034,SC2016  # sourced; single quotes are the tenant's script
# The soak's workloads (sourced by scripts/soak.d/worker.sh). Each `wl_NAME TAG` runs real
# corral commands and appends one `CMD STATUS EXPECTED` line per command to $ST, EXPECTED
# being the statuses that command gives when no fault hits it (comma-separated). Every
# tenant command carries the word soakmark-TAG, which is how chaos.sh finds the tenant.
# Uses: C (corral), SRV_PORT, UDP_PORT, CANARY_PORT, STORE (this worker's kept storage),
# CONFINE_DIR (this worker's confine boundary), GRANTS (step's grants file), IMAGE (the
# containers' image, empty without podman) and RUNTIME (corral-runtime).

ALLOW="--allow srv.soak.test:$SRV_PORT --allow udp:srv.soak.test:$UDP_PORT --resolve srv.soak.test=127.0.0.1 --internal 127.0.0.1/32"

# note CMD EXPECTED STATUS
note() { echo "$1 $3 $2" >>"$ST"; }

wl_true() {
	"$C" run -- /bin/true soakmark-"$1"
	note run 0 $?
}

wl_curl() {
	# shellcheck disable=SC2086
	"$C" run $ALLOW -- sh -c 'curl -sf -m 5 http://srv.soak.test:'"$SRV_PORT"'/ | grep -qx ok' soakmark-"$1"
	note run 0 $?
}

wl_dns() {
	# shellcheck disable=SC2086
	"$C" run $ALLOW -- sh -c 'getent hosts srv.soak.test >/dev/null && ! getent hosts canary.soak.test' soakmark-"$1"
	note run 0 $?
}

wl_udp() {
	# shellcheck disable=SC2086
	"$C" run $ALLOW -- sh -c 'echo ping-$0 | socat -t 0.5 - UDP:srv.soak.test:'"$UDP_PORT"' | grep -q ping' soakmark-"$1"
	note run 0 $?
}

# The canaries, each tried: a port no entry names, an address no entry names, a name no
# entry names, a UDP port no entry names; then the allowed server, the control (exit 0
# only when every attempt failed and the control answered).
wl_canary() {
	# shellcheck disable=SC2086
	"$C" run $ALLOW -- sh -c '
		curl -s -m 2 http://srv.soak.test:'"$CANARY_PORT"'/ && exit 10
		curl -s -m 2 http://127.0.0.2:'"$SRV_PORT"'/ && exit 11
		curl -s -m 2 http://canary.soak.test:'"$SRV_PORT"'/ && exit 12
		echo x | socat -t 0.2 - UDP:srv.soak.test:'"$CANARY_PORT"' 2>/dev/null
		echo x | socat -t 0.2 - UDP:127.0.0.1:'"$CANARY_PORT"' 2>/dev/null
		curl -sf -m 5 http://srv.soak.test:'"$SRV_PORT"'/ | grep -qx ok' soakmark-"$1"
	note run 0 $?
	# no allowlist at all: no network
	"$C" run -- sh -c 'curl -s -m 1 http://127.0.0.1:'"$CANARY_PORT"'/ && exit 10; exit 0' soakmark-"$1"
	note run-nonet 0 $?
}

# A server that resets, one that stalls (ended by --wall: 124).
wl_reset() {
	# shellcheck disable=SC2086
	"$C" run $ALLOW -- sh -c 'curl -s -m 5 http://srv.soak.test:'"$SRV_PORT"'/reset' soakmark-"$1"
	note run-reset 56 $?
}

wl_stall() {
	# shellcheck disable=SC2086
	"$C" run --wall 1s $ALLOW -- sh -c 'curl -s http://srv.soak.test:'"$SRV_PORT"'/stall' soakmark-"$1"
	note run-stall 124 $?
}

# A name the host resolves through the private resolv.conf's resolver, which never answers:
# the connect fails (curl 7 or 56) or --wall ends it (124).
wl_resolver() {
	"$C" run --wall 1s --allow hang.soak.test:"$SRV_PORT" --internal 127.0.0.0/8 -- \
		sh -c 'curl -s -m 5 http://hang.soak.test:'"$SRV_PORT"'/' soakmark-"$1"
	note run-resolver 7,28,52,56,124 $?
}

# The kept storage: each run checks the blob the last one left (its last line is the
# sha256 of the lines before), then replaces it atomically and prints the new sum.
wl_storage() {
	"$C" run --storage "$STORE" -- sh -c '
		cd /storage || exit 90
		if [ -f blob ]; then [ "$(head -n -1 blob | sha256sum | cut -c1-64)" = "$(tail -n 1 blob)" ] || exit 91; fi
		head -c 3000 /dev/urandom | od -An -tx1 >blob.new && sha256sum <blob.new | cut -c1-64 >>blob.new
		mv blob.new blob && tail -n 1 blob' soakmark-"$1" >"$ST.sum"
	note run-storage 0 $?
}

wl_session() {
	local id="soak-$1"
	# shellcheck disable=SC2086
	"$C" create "$id" $ALLOW >/dev/null
	note create 0 $?
	# a create refused (a fault) leaves no sandbox to exec in
	[ "$(tail -n 1 "$ST")" = "create 0 0" ] || return
	"$C" exec "$id" -- sh -c 'echo kept >/tmp/f; sleep 0.2' soakmark-"$1"
	note exec 0 $?
	# the second reads what the first wrote: only after it completed
	if [ "$(tail -n 1 "$ST")" = "exec 0 0" ]; then
		"$C" exec "$id" -- sh -c 'grep -qx kept /tmp/f && curl -sf -m 5 http://srv.soak.test:'"$SRV_PORT"'/ >/dev/null' soakmark-"$1"
		note exec 0 $?
	fi
	"$C" rm "$id" >/dev/null
	note rm 0 $?
}

wl_confine() {
	"$C" confine --exec --permit "$CONFINE_DIR" -- sh -c '
		echo "$0" >'"$CONFINE_DIR"'/last && ! cat /etc/shadow 2>/dev/null && grep -qx "$0" '"$CONFINE_DIR"'/last' soakmark-"$1"
	note confine 0 $?
}

wl_step() {
	"$C" step --grants "$GRANTS" -- /usr/bin/head -1 /etc/hostname >/dev/null
	note step 0 $?
}

# A container through corral-runtime under podman (when drive.sh made the image): the
# allowed server answers, the canary's port is refused. Its engine client is what the
# kill-engine fault strikes.
wl_container() {
	podman --runtime "$RUNTIME" --cgroup-manager cgroupfs run --rm --pull never --network none \
		--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 -v /usr:/usr:ro \
		--annotation corral.dev/allow=srv.soak.test:"$SRV_PORT" \
		--annotation corral.dev/resolve=srv.soak.test=127.0.0.1 --annotation corral.dev/internal=127.0.0.1/32 \
		"$IMAGE" sh -c 'curl -sf -m 5 http://srv.soak.test:'"$SRV_PORT"'/ | grep -qx ok &&
			! curl -s -m 2 http://srv.soak.test:'"$CANARY_PORT"'/' soakmark-"$1" >/dev/null
	note container 0 $?
}

# name weight: how often each is picked
# (the short ones most often: the goal is runs per minute); SOAK_WORKLOADS replaces it
WORKLOADS="true:6 curl:4 dns:2 udp:1 canary:2 reset:1 stall:1 resolver:1 storage:4 session:2 confine:3 step:2"
[ -n "$IMAGE" ] && WORKLOADS="$WORKLOADS container:1"
WORKLOADS=${SOAK_WORKLOADS:-$WORKLOADS}
