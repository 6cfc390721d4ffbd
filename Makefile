# corral — build, install, test.
#
# Variables follow LuaRocks' make backend so that `luarocks make` can drive this file
# (rockspec/corral-scm-1.rockspec passes them); every one can be overridden by hand.

LUA_VERSION ?= 5.4
LUA         ?= lua$(LUA_VERSION)
PKG_CONFIG  ?= pkg-config
CC          ?= cc
PREFIX      ?= /usr/local
DESTDIR     ?=
LUA_INCDIR  ?= /usr/include/lua$(LUA_VERSION)
LUA_LIBDIR  ?=
LUA_LIBNAME ?= lua$(LUA_VERSION)
INST_BINDIR ?= $(PREFIX)/bin
INST_LIBDIR ?= $(PREFIX)/lib/lua/$(LUA_VERSION)
INST_LUADIR ?= $(PREFIX)/share/lua/$(LUA_VERSION)
LIBFLAG     ?= -shared
CAP_INCDIR     ?=
CAP_LIBDIR     ?=
MNL_INCDIR     ?=
MNL_LIBDIR     ?=
NFTNL_INCDIR   ?=
NFTNL_LIBDIR   ?=
SECCOMP_INCDIR ?=
SECCOMP_LIBDIR ?=
CRYPTO_INCDIR  ?=
CRYPTO_LIBDIR  ?=

BUILD ?= build
OPT   ?= -O2 -g
SAN   ?=

WARN = -std=gnu11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
       -Wformat=2 -Werror
incflag = $(if $(1),-I$(1))
libflag = $(if $(1),-L$(1))
CORE_CFLAGS = $(WARN) $(OPT) $(SAN) -fPIC -fvisibility=hidden -D_GNU_SOURCE \
       -Icore/lib -Icore/lua -I$(BUILD)/gen $(call incflag,$(LUA_INCDIR)) \
       $(call incflag,$(CAP_INCDIR)) $(call incflag,$(MNL_INCDIR)) \
       $(call incflag,$(NFTNL_INCDIR)) $(call incflag,$(SECCOMP_INCDIR)) \
       $(call incflag,$(CRYPTO_INCDIR))
EXT_LIBS = $(call libflag,$(CAP_LIBDIR)) $(call libflag,$(MNL_LIBDIR)) \
       $(call libflag,$(NFTNL_LIBDIR)) $(call libflag,$(SECCOMP_LIBDIR)) \
       -lcap -lseccomp -lnftnl -lmnl -lpthread

# readline gives the REPL line editing and history; without it the REPL still works.
HAVE_READLINE := $(shell printf '\#include <stdio.h>\n\#include <readline/readline.h>\n' | \
                   $(CC) -E - >/dev/null 2>&1 && echo 1)
HOST_DEFS = $(if $(HAVE_READLINE),-DCORRAL_USE_READLINE)
# The host links its libraries statically where an archive exists: it is the wrapper on
# every confined launch, and measured here each shared library costs its start-up
# ~0.05-0.1 ms (scripts/bench/launch). C modules it loads (cjson, …) bind to the Lua API
# it exports (-rdynamic), as they do with lua5.4 itself.
static_or_dyn = $(if $(filter /%,$(shell $(CC) -print-file-name=lib$(1).a)),$(shell $(CC) -print-file-name=lib$(1).a),-l$(1))
HOST_STATIC ?= 1
ifeq ($(HOST_STATIC),1)
HOST_EXT = $(foreach l,$(LUA_LIBNAME) cap seccomp nftnl,$(call static_or_dyn,$(l))) -lmnl -lpthread
# readline (and the terminfo library it needs) too: only the REPL uses it, yet mapping
# and relocating both cost every start ~0.15-0.25 ms here (`corral -e ''`, 400 runs)
READLINE_LIBS = $(call static_or_dyn,readline) $(call static_or_dyn,tinfo)
else
HOST_EXT = -l$(LUA_LIBNAME) $(EXT_LIBS)
READLINE_LIBS = -lreadline
endif
HOST_LIBS = $(call libflag,$(LUA_LIBDIR)) $(call libflag,$(CAP_LIBDIR)) $(call libflag,$(MNL_LIBDIR)) \
            $(call libflag,$(NFTNL_LIBDIR)) $(call libflag,$(SECCOMP_LIBDIR)) \
            $(HOST_EXT) $(if $(HAVE_READLINE),$(READLINE_LIBS)) -ldl -lm

# sign.c and its binding link libcrypto: they are built into corral/sign.so alone
SIGN_SRC := core/lib/sign.c core/lua/l_sign.c
# TLS termination for bound secrets links libssl and libhttp_parser: corral/tls.so alone
TLS_LIB  := core/lib/tls_ca.c core/lib/standin.c core/lib/http1.c core/lib/h2.c core/lib/intercept.c
TLS_SRC  := $(TLS_LIB) core/lua/l_tls.c
LIB_SRC  := $(filter-out $(SIGN_SRC) $(TLS_SRC),$(sort $(wildcard core/lib/*.c)))
BIND_SRC := $(filter-out $(SIGN_SRC) $(TLS_SRC),$(sort $(wildcard core/lua/*.c)))
HOST_SRC := $(sort $(wildcard core/host/*.c))
LIB_OBJ  := $(LIB_SRC:core/lib/%.c=$(BUILD)/obj/lib/%.o)
BIND_OBJ := $(BIND_SRC:core/lua/%.c=$(BUILD)/obj/lua/%.o)
HEADERS  := $(wildcard core/lib/*.h core/lua/*.h core/host/*.h)
CTEST_SRC := $(sort $(wildcard tests/c/test_*.c))
CTEST_HDR := $(wildcard tests/c/*.h)
CTEST_BIN := $(CTEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

LUA_MOD  := $(sort $(shell find lua -name '*.lua'))
# The modules' bytecode, loaded by the host instead of compiling them at every start
# (core/host/compiled.h); each named after its source, which stays what tracebacks show.
LUAC_STAMP = $(BUILD)/luac/.built

CORE_SO  = corral/core.so
SIGN_SO  = corral/sign.so
TLS_SO   = corral/tls.so
HOST     = $(BUILD)/corral-host
FRONT    = $(BUILD)/corral
WRAPPER  = $(BUILD)/corral-exec-confined
LIBCORE  = $(BUILD)/libcorral.a

.PHONY: uninstall all deps test test-c demo install lint asan fuzz bench bench-tools clean

all: $(CORE_SO) $(SIGN_SO) $(TLS_SO) $(HOST) $(FRONT) $(WRAPPER) $(LUAC_STAMP) $(BUILD)/corral-runtime

# corral-runtime is the host under another name (core/host/main.c dispatches on it): an
# engine calls it with runc's command line, and a link to the host itself costs no extra
# exec (a link to the front works too, through one).
$(BUILD)/corral-runtime: $(HOST)
	@ln -sf corral-host $@

deps:
	@scripts/install-deps

$(BUILD)/obj/lib/%.o: core/lib/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CORE_CFLAGS) $(CFLAGS) -c -o $@ $<

# The seccomp programs corral installs, built once here by libseccomp instead of at
# every launch (core/gen/seccomp_tables.c says what it saves).
$(BUILD)/gen/seccomp_tables.h: core/gen/seccomp_tables.c core/lib/seccomp.c core/lib/seccomp.h \
    core/lib/tier_seccomp.c core/lib/tier_seccomp.h
	@mkdir -p $(dir $@)
	@echo "  GEN     $@"
	@$(CC) $(CORE_CFLAGS) $(CFLAGS) -o $(BUILD)/gen/seccomp_tables core/gen/seccomp_tables.c \
	    core/lib/seccomp.c core/lib/tier_seccomp.c $(EXT_LIBS)
	@$(BUILD)/gen/seccomp_tables > $@.tmp && mv $@.tmp $@

# The tables of `corral confine --exec`'s C fast path, from the Lua modules that own them
# (core/gen/confine_fast_tables.lua): one list of protected names and probe-cache key parts.
$(BUILD)/gen/confine_fast_tables.h: core/gen/confine_fast_tables.lua lua/corral/confinement/protected.lua \
    lua/corral/probe_cache.lua
	@mkdir -p $(dir $@)
	@echo "  GEN     $@"
	@$(LUA) core/gen/confine_fast_tables.lua lua > $@.tmp && mv $@.tmp $@

$(BUILD)/obj/lua/l_spawn.o $(BUILD)/obj/lua/l_seccomp.o \
    $(BUILD)/obj/lib/tier.o $(BUILD)/obj/lua/l_tier.o: \
    $(BUILD)/gen/seccomp_tables.h

$(BUILD)/obj/lua/%.o: core/lua/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CORE_CFLAGS) $(CFLAGS) -c -o $@ $<

$(LIBCORE): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	@rm -f $@ && ar rcs $@ $^

$(CORE_SO): $(BIND_OBJ) $(LIBCORE)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LIBFLAG) $(SAN) $(LDFLAGS) -o $@ $(BIND_OBJ) $(LIBCORE) $(EXT_LIBS)

# Receipts' signatures (core/lib/sign.h): the one module linked against libcrypto, loaded
# by `require "corral.sign"` only when a receipt is signed or verified, so that no other
# start-up maps libcrypto (each shared library costs ~0.05-0.1 ms, see HOST_STATIC).
$(SIGN_SO): $(BUILD)/obj/lua/l_sign.o $(BUILD)/obj/lib/sign.o
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LIBFLAG) $(SAN) $(LDFLAGS) -o $@ $^ $(call libflag,$(CRYPTO_LIBDIR)) -lcrypto

# Secrets' TLS termination (core/lib/intercept.h): libssl, libcrypto, libhttp_parser, libnghttp2,
# mapped only by a run that binds a secret (`require "corral.tls"`), for the same reason.
TLS_OBJ := $(TLS_LIB:core/lib/%.c=$(BUILD)/obj/lib/%.o) $(BUILD)/obj/lua/l_tls.o
$(TLS_SO): $(TLS_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(LIBFLAG) $(SAN) $(LDFLAGS) -o $@ $^ $(call libflag,$(CRYPTO_LIBDIR)) -lssl -lcrypto \
	    -lhttp_parser -lnghttp2 -lpthread

$(BUILD)/tests/test_sign: tests/c/test_sign.c $(CTEST_HDR) $(HEADERS) $(BUILD)/obj/lib/sign.o $(LIBCORE)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(CORE_CFLAGS) $(CFLAGS) -Itests/c -o $@ $< $(BUILD)/obj/lib/sign.o $(LIBCORE) \
	    $(call libflag,$(CRYPTO_LIBDIR)) -lcrypto

# The host exports the Lua API (-rdynamic) so that C modules it loads (cjson, …)
# bind to the same interpreter. core/host also holds the exec-confined wrapper (a
# program of its own: it prints its diagnostic and exits, which core/lib never does).
$(HOST): $(HOST_SRC) $(wildcard core/host/*.h) $(BIND_OBJ) $(LIBCORE) $(HEADERS) $(BUILD)/gen/seccomp_tables.h \
    $(BUILD)/gen/confine_fast_tables.h
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(CORE_CFLAGS) $(HOST_DEFS) $(CFLAGS) -fvisibility=default -rdynamic $(LDFLAGS) \
	    -o $@ $(HOST_SRC) $(BIND_OBJ) $(LIBCORE) $(HOST_LIBS)

# The confinement wrapper alone (core/wrapper), the program `corral confine` specs name:
# the host's exec-confined code without the Lua host. Where musl-gcc is installed it is
# linked statically against musl, whose start-up probes no CPU features (under a
# hypervisor that traps cpuid, glibc's probing costs ~1.2 ms of every exec here); the
# kernel's own headers and libcap's archive come from the system, and --gc-sections
# keeps only what the wrapper reaches. Elsewhere (no musl, or a sanitizer build) it is
# linked like the host, with $(CC).
# Both are looked up when the wrapper is linked, so that `make demo` finds the musl that
# its `deps` step has just installed.
MUSL_CC     ?= $(if $(SAN),,$(shell command -v musl-gcc 2>/dev/null))
CAP_ARCHIVE  = $(filter /%,$(shell $(CC) -print-file-name=libcap.a))
MULTIARCH    = $(shell $(CC) -print-multiarch 2>/dev/null)

# The recipe of a program of its own in C (the wrapper, the front), $(1) its sources:
# statically against musl where musl-gcc is installed (no glibc start-up on a launch's
# path), else with $(CC).
define link_c_program
	@mkdir -p $(dir $@)
	@if [ -n "$(MUSL_CC)" ] && [ -n "$(CAP_ARCHIVE)" ]; then \
	  echo "  LD      $@ (musl, static)"; \
	  $(MUSL_CC) -static $(WARN) $(OPT) -D_GNU_SOURCE -ffunction-sections -fdata-sections \
	    -Wl,--gc-sections -Icore/lib -Icore/host -I$(BUILD)/gen $(call incflag,$(CAP_INCDIR)) \
	    $(call incflag,$(SECCOMP_INCDIR)) -idirafter /usr/include \
	    $(if $(MULTIARCH),-idirafter /usr/include/$(MULTIARCH)) $(CFLAGS) $(LDFLAGS) \
	    -o $@ $(1) $(LIB_SRC) $(CAP_ARCHIVE); \
	else \
	  echo "  LD      $@ ($(CC))"; \
	  $(CC) $(CORE_CFLAGS) $(CFLAGS) -Icore/host -I$(BUILD)/gen $(LDFLAGS) -o $@ $(1) $(LIBCORE) \
	    $(call libflag,$(CAP_LIBDIR)) $(call libflag,$(SECCOMP_LIBDIR)) \
	    $(foreach l,cap seccomp,$(call static_or_dyn,$(l))) -lpthread; \
	fi
endef

WRAPPER_SRC := core/wrapper/exec_confined.c core/host/confine.c core/host/confine_bwrap.c \
               core/host/confine_readonly.c
$(WRAPPER): $(WRAPPER_SRC) $(LIB_SRC) $(HEADERS) $(BUILD)/gen/seccomp_tables.h $(LIBCORE)
	$(call link_c_program,$(WRAPPER_SRC))

# The front (core/front/front.c), the program named `corral`: it serves `corral exec` and
# `corral confine --exec` (the confine fast path, with the wrapper's code) itself and hands
# every other command line to the host beside it. Linked like the wrapper: statically
# against musl where musl-gcc is installed, else with $(CC). The Makefile is a
# prerequisite: a tree built before the front existed holds the host at this very path,
# newer than these sources.
FRONT_SRC := core/front/front.c core/host/dispatch.c core/host/session_exec.c core/host/session_tty.c \
             core/host/confine_fast.c core/host/confine_fast_cache.c core/host/confine_fast_protected.c \
             $(filter-out core/wrapper/exec_confined.c,$(WRAPPER_SRC))
$(FRONT): $(FRONT_SRC) $(LIB_SRC) $(HEADERS) $(BUILD)/gen/seccomp_tables.h $(BUILD)/gen/confine_fast_tables.h \
    $(LIBCORE) Makefile
	$(call link_c_program,$(FRONT_SRC))

$(LUAC_STAMP): $(LUA_MOD) scripts/compile-lua
	@mkdir -p $(dir $@)
	@echo "  LUAC    $(dir $@)"
	@$(LUA) scripts/compile-lua $(dir $@) lua $(CURDIR)/lua $(LUA_MOD)
	@touch $@

$(BUILD)/tests/%: tests/c/%.c $(CTEST_HDR) $(HEADERS) $(LIBCORE)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(CORE_CFLAGS) $(CFLAGS) -Itests/c -o $@ $< $(LIBCORE) $(EXT_LIBS)

# The fuzz targets' corpora replayed by `make test` (tests/c/test_fuzz_corpus.c): each C
# target (tests/fuzz/fuzz_<name>.c) built as an object of its own, its entry point renamed
# fuzz_<name>_one, with the library code it drives; the Lua targets through
# tests/fuzz/fuzz_lua.c. All of it under ASan and UBSan where $(CC) links them, so that a
# sanitizer's report fails the replay as a crash does; without them, it replays plain.
FUZZ_SAN = $(shell printf 'int main(void){return 0;}\n' | $(CC) -fsanitize=address,undefined \
             -x c -o /dev/null - 2>/dev/null && echo -fsanitize=address,undefined \
             -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
FUZZ_C_TARGETS := sni dns session_wire http1 h2
FUZZ_LIB_sni          := core/lib/sni.c
FUZZ_LIB_dns          := core/lib/dns.c
FUZZ_LIB_session_wire := core/lib/session_wire.c core/lib/jsontext.c
FUZZ_LIB_http1        := core/lib/http1.c core/lib/standin.c
FUZZ_LIB_h2           := core/lib/h2.c core/lib/standin.c
FUZZ_REPLAY_SRC := $(sort $(foreach t,$(FUZZ_C_TARGETS),$(FUZZ_LIB_$(t))))
FUZZ_REPLAY_DEP := $(wildcard tests/fuzz/*.c tests/fuzz/*.h) $(FUZZ_REPLAY_SRC)
FUZZ_CFLAGS = $(WARN) -O1 -g -D_GNU_SOURCE -Icore/lib $(call incflag,$(LUA_INCDIR))

$(BUILD)/tests/test_fuzz_corpus: tests/c/test_fuzz_corpus.c $(CTEST_HDR) $(HEADERS) $(FUZZ_REPLAY_DEP)
	@mkdir -p $(dir $@) $(BUILD)/fuzz-replay
	@echo "  LD      $@"
	@san='$(FUZZ_SAN)'; for t in $(FUZZ_C_TARGETS); do \
	  $(CC) $(FUZZ_CFLAGS) $$san -DLLVMFuzzerTestOneInput=fuzz_$${t}_one -c \
	    -o $(BUILD)/fuzz-replay/fuzz_$$t.o tests/fuzz/fuzz_$$t.c || exit 1; \
	done; \
	$(CC) $(FUZZ_CFLAGS) $$san -Itests/c -o $@ $< $(foreach t,$(FUZZ_C_TARGETS),$(BUILD)/fuzz-replay/fuzz_$(t).o) \
	    tests/fuzz/fuzz_lua.c $(FUZZ_REPLAY_SRC) $(call libflag,$(LUA_LIBDIR)) -l$(LUA_LIBNAME) \
	    -lhttp_parser -lnghttp2 $(call libflag,$(CRYPTO_LIBDIR)) -lcrypto -ldl -lm

test-c: $(CTEST_BIN)

test: deps all test-c
	@scripts/run-tests --lua $(LUA) --build $(BUILD)

demo: deps all
	@$(HOST) scripts/demo.lua

# The installed layout: the host finds its modules relative to itself (core/host/main.c),
# so PREFIX/bin/corral runs from inside its own confinements wherever PREFIX is in the
# runtime read set (/usr, /usr/local); a spec names that binary, not the build tree's.
# DESTDIR stages the same tree for a package: binary, modules, C module, man pages, docs.
INST_MANDIR ?= $(PREFIX)/share/man
INST_DOCDIR ?= $(PREFIX)/share/doc/corral

install: all
	install -d $(DESTDIR)$(INST_BINDIR) $(DESTDIR)$(INST_LIBDIR)/corral \
	    $(DESTDIR)$(INST_LUADIR)/corral $(DESTDIR)$(INST_MANDIR)/man1 $(DESTDIR)$(INST_DOCDIR)
	install -m 0755 $(FRONT) $(DESTDIR)$(INST_BINDIR)/corral
	install -m 0755 $(HOST) $(DESTDIR)$(INST_BINDIR)/corral-host
	install -m 0755 $(WRAPPER) $(DESTDIR)$(INST_BINDIR)/corral-exec-confined
	ln -sf corral-host $(DESTDIR)$(INST_BINDIR)/corral-runtime
	install -m 0755 $(CORE_SO) $(DESTDIR)$(INST_LIBDIR)/corral/core.so
	install -m 0755 $(SIGN_SO) $(DESTDIR)$(INST_LIBDIR)/corral/sign.so
	install -m 0755 $(TLS_SO) $(DESTDIR)$(INST_LIBDIR)/corral/tls.so
	cd lua && find corral -name '*.lua' -exec install -D -m 0644 {} \
	    $(DESTDIR)$(INST_LUADIR)/{} \;
	install -d $(DESTDIR)$(INST_LIBDIR)/corral/luac
	$(LUA) scripts/compile-lua $(DESTDIR)$(INST_LIBDIR)/corral/luac lua $(INST_LUADIR) $(LUA_MOD)
	install -m 0644 man/*.1 $(DESTDIR)$(INST_MANDIR)/man1/
	install -m 0644 README.md docs/*.md $(DESTDIR)$(INST_DOCDIR)/
	install -D -m 0644 docs/boundary.md $(DESTDIR)$(PREFIX)/share/corral/boundary.md

uninstall:
	rm -f $(DESTDIR)$(INST_BINDIR)/corral $(DESTDIR)$(INST_BINDIR)/corral-host \
	    $(DESTDIR)$(INST_BINDIR)/corral-exec-confined \
	    $(DESTDIR)$(INST_BINDIR)/corral-runtime \
	    $(DESTDIR)$(INST_LIBDIR)/corral/core.so $(DESTDIR)$(INST_LIBDIR)/corral/sign.so \
	    $(DESTDIR)$(INST_LIBDIR)/corral/tls.so
	rm -rf $(DESTDIR)$(INST_LIBDIR)/corral/luac
	rm -rf $(DESTDIR)$(INST_LUADIR)/corral $(DESTDIR)$(INST_DOCDIR) \
	    $(DESTDIR)$(PREFIX)/share/corral
	cd man && for m in *.1; do rm -f $(DESTDIR)$(INST_MANDIR)/man1/$$m; done
	-rmdir $(DESTDIR)$(INST_LIBDIR)/corral

lint:
	luacheck lua tests scripts/*.lua scripts/examples/*.lua scripts/bench/*.lua
	clang-format --dry-run --Werror core/lib/*.[ch] core/lua/*.[ch] core/host/*.[ch] core/wrapper/*.c core/front/*.c core/gen/*.c tests/c/*.[ch] \
	    tests/fuzz/*.[ch] \
	    scripts/bench/*.c

# The whole suite, through the host, under AddressSanitizer and UBSan.
asan: deps
	$(MAKE) BUILD=build/asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    build/asan/corral build/asan/corral-host test-c
	@ln -sfn ../lua build/lua  # the host finds its modules at <exe dir>/../lua
	ASAN_OPTIONS=detect_leaks=0 scripts/run-tests --lua build/asan/corral --build build/asan

fuzz: deps all
	@scripts/run-fuzz

# The C drivers the bench scripts run (scripts/bench/*.c), under the core's warnings.
BENCH_CFLAGS = $(WARN) -O2 -D_GNU_SOURCE -Icore/lib

$(BUILD)/bench/egress: scripts/bench/egress_bench.c $(LIBCORE) $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(BENCH_CFLAGS) -o $@ $< $(LIBCORE) $(EXT_LIBS)

$(BUILD)/bench/dns_bench: scripts/bench/dns_bench.c core/lib/dns.c core/lib/dns.h
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	@$(CC) $(BENCH_CFLAGS) -o $@ $< core/lib/dns.c

bench-tools: $(BUILD)/bench/egress $(BUILD)/bench/dns_bench

bench: deps all bench-tools
	@for b in scripts/bench/*; do [ -x "$$b" ] || continue; "$$b"; done

clean:
	rm -rf build corral
