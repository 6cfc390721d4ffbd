rockspec_format = "3.0"
package = "corral"
version = "scm-1"
source = {
   url = "git+file://./corral",
}
description = {
   summary = "Linux process confinement: a C core and Lua policy",
   detailed = [[
corral confines processes to one directory, runs untrusted tenant code with
credentials stripped and egress checked against an allowlist, and proves on each host
which protections hold. It installs the Lua module `corral` (with the C module
`corral.core`) and the `corral` executable: Lua 5.4 with the core preloaded.
]],
   license = "MIT",
   labels = { "security", "sandbox", "linux" },
}
dependencies = {
   "lua >= 5.4, < 5.5",
   "dkjson",
}
external_dependencies = {
   CAP = { header = "sys/capability.h", library = "cap" },
   MNL = { header = "libmnl/libmnl.h", library = "mnl" },
   NFTNL = { header = "libnftnl/table.h", library = "nftnl" },
   SECCOMP = { header = "seccomp.h", library = "seccomp" },
   -- corral/sign.so alone (receipts' signatures): docs/receipts.md
   CRYPTO = { header = "openssl/evp.h", library = "crypto" },
   -- corral/tls.so alone (--secret's TLS termination)
   SSL = { header = "openssl/ssl.h", library = "ssl" },
   HTTP_PARSER = { header = "http_parser.h", library = "http_parser" },
   NGHTTP2 = { header = "nghttp2/nghttp2.h", library = "nghttp2" },
}
build = {
   type = "make",
   build_target = "all",
   build_variables = {
      CFLAGS = "$(CFLAGS)",
      LIBFLAG = "$(LIBFLAG)",
      LUA = "$(LUA)",
      LUA_INCDIR = "$(LUA_INCDIR)",
      LUA_LIBDIR = "$(LUA_LIBDIR)",
      CAP_INCDIR = "$(CAP_INCDIR)",
      CAP_LIBDIR = "$(CAP_LIBDIR)",
      MNL_INCDIR = "$(MNL_INCDIR)",
      MNL_LIBDIR = "$(MNL_LIBDIR)",
      NFTNL_INCDIR = "$(NFTNL_INCDIR)",
      NFTNL_LIBDIR = "$(NFTNL_LIBDIR)",
      SECCOMP_INCDIR = "$(SECCOMP_INCDIR)",
      SECCOMP_LIBDIR = "$(SECCOMP_LIBDIR)",
      CRYPTO_INCDIR = "$(CRYPTO_INCDIR)",
      CRYPTO_LIBDIR = "$(CRYPTO_LIBDIR)",
   },
   install_target = "install",
   copy_directories = { "docs" },
   install_variables = {
      PREFIX = "$(PREFIX)",
      INST_BINDIR = "$(BINDIR)",
      INST_LIBDIR = "$(LIBDIR)",
      INST_LUADIR = "$(LUADIR)",
   },
}
test_dependencies = { "busted" }
test = {
   type = "busted",
}
