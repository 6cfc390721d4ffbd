--- The tenant seccomp filter as an OCI engine's JSON profile (`--security-opt
-- seccomp=FILE`), for the `oci` mechanism.
--
-- The same rules as the filter corral installs itself (core/lib/seccomp.c): the calls in
-- `DENY` refused with EPERM; clone3 and openat2 refused as absent (ENOSYS), so callers
-- fall back to clone and openat, whose arguments a filter can read; clone and unshare
-- with CLONE_NEWUSER refused; TIOCSTI and TIOCLINUX refused; no setuid or setgid bit set
-- by chmod or at creation; sockets only of the unix, IPv4, IPv6 and netlink families;
-- personality only 0 and the query. Everything else is allowed (the profile's default),
-- as in corral's own filter. tests/oci_spec.lua keeps `DENY` equal to the C list.
-- @module corral.mechanism.oci.seccomp
local M = {}

--- The calls refused outright with EPERM (core/lib/seccomp.c's deny_eperm).
M.DENY = {
  "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount",
  "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kexec_load",
  "kexec_file_load", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
  "open_by_handle_at", "name_to_handle_at", "init_module", "finit_module", "delete_module", "acct", "swapon",
  "swapoff", "reboot", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "quotactl",
  "quotactl_fd", "lookup_dcookie", "vhangup", "io_uring_setup", "io_uring_enter", "io_uring_register", "setns",
}

local EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
local CLONE_NEWUSER = 0x10000000
local TIOCSTI, TIOCLINUX = 0x5412, 0x541C
local S_ISUID, S_ISGID = 4096, 1024 -- 04000, 02000
local O_CREAT, O_TMPFILE = 64, 4259840 -- 0100, 020200000 (x86-64, aarch64)
local AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16

-- `arg` is the mode's index, `flags` the open flags' (O_CREAT / O_TMPFILE) or nil.
local MODE_CALLS = {
  { "chmod", 1 }, { "fchmod", 1 }, { "fchmodat", 2 }, { "fchmodat2", 2 }, { "open", 2, 1 }, { "openat", 3, 2 },
  { "creat", 1 }, { "mknod", 1 }, { "mknodat", 2 },
}

local function masked(index, mask, value)
  return { index = index, value = mask, valueTwo = value, op = "SCMP_CMP_MASKED_EQ" }
end

--- The profile as a Lua table (the engines' seccomp JSON format).
-- @treturn table
function M.profile()
  local rules = {}
  local function rule(names, errno, args)
    rules[#rules + 1] = { names = names, action = "SCMP_ACT_ERRNO", errnoRet = errno, args = args }
  end
  rule(M.DENY, EPERM)
  rule({ "clone3", "openat2" }, ENOSYS)
  rule({ "unshare", "clone" }, EPERM, { masked(0, CLONE_NEWUSER, CLONE_NEWUSER) })
  for _, req in ipairs({ TIOCSTI, TIOCLINUX }) do rule({ "ioctl" }, EPERM, { masked(1, 0xffffffff, req) }) end
  for _, c in ipairs(MODE_CALLS) do
    for _, bit in ipairs({ S_ISUID, S_ISGID }) do
      if c[3] then
        for _, flag in ipairs({ O_CREAT, O_TMPFILE }) do
          rule({ c[1] }, EPERM, { masked(c[2], bit, bit), masked(c[3], flag, flag) })
        end
      else
        rule({ c[1] }, EPERM, { masked(c[2], bit, bit) })
      end
    end
  end
  rule({ "socket", "socketpair" }, EAFNOSUPPORT, { { index = 0, value = AF_NETLINK + 1, op = "SCMP_CMP_GE" } })
  for fam = 0, AF_NETLINK - 1 do
    if fam ~= AF_UNIX and fam ~= AF_INET and fam ~= AF_INET6 then
      rule({ "socket", "socketpair" }, EAFNOSUPPORT, { { index = 0, value = fam, op = "SCMP_CMP_EQ" } })
    end
  end
  -- Neither all-zero nor all-one in the low 32 bits: some bit set whose neighbour is clear.
  for i = 0, 31 do
    local bit, nxt = 1 << i, 1 << ((i + 1) % 32)
    rule({ "personality" }, EPERM, { masked(0, bit | nxt, bit) })
  end
  return { defaultAction = "SCMP_ACT_ALLOW", syscalls = rules }
end

--- The profile as JSON text.
-- @treturn string
function M.json()
  -- In a fixed key order: the file is named by its content.
  return require("corral.json").encode(M.profile(), { keyorder = { "defaultAction", "syscalls", "names", "action",
    "errnoRet", "args", "index", "value", "valueTwo", "op" } })
end

return M
