# EMP top-level entry points.
#   make           build everything (release) and the signed firmware image
#   make test      every test: unit, property, C layout, simulation suite,
#                  firmware signing, chassis integration (real emp-nicd),
#                  then every TAP suite across 4 network namespaces over the
#                  udp and packet wires, with loss, and faults across hosts
#                  (scripts/netns/suite.sh; needs root), then the kernel path
#                  in QEMU guests (scripts/vm/suite.sh; builds the toolchain
#                  and guest kernel once, cached)
#   make netns-test  the namespace suites alone
#   make kfuzz     the long run of the guest ioctl/mmap fuzzer of emp.ko:
#                  1 M calls as an ordinary user (KFUZZ_CALLS, KFUZZ_SEED,
#                  KFUZZ_THREADS override; scripts/vm/kfuzz.sh)
#   make demo      the main job: a 4-NIC chassis, latency and bandwidth
#   make lint      rustfmt (workspace and driver), clippy -D warnings, rustdoc
#                  -D warnings, no module cycles; part of make test
#   make fmt       format the workspace and the driver
#   make firmware  (re)build firmware-blobs/emp-fw.bin, signed with the
#                  development key (generated once, never committed)
#   make install   install what `make build` (and `make driver`) built:
#                  PREFIX=/usr/local, DESTDIR for staging (docs/install.md)
CARGO ?= cargo

.PHONY: all build firmware test demo setup clean driver kernel vm-test netns-test kfuzz lint fmt install

# The Rust-for-Linux toolchain and guest kernel (cached in ~/.cache/emp).
kernel:
	@scripts/kernel/build.sh >/dev/null

# emp.ko against the cached guest kernel, or any Rust-enabled tree (KDIR=…).
KLLVM ?= -22
driver:
	$(MAKE) -C "$(if $(KDIR),$(KDIR),$$(scripts/kernel/build.sh))" M=$(CURDIR) LLVM=$(KLLVM) \
		RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
		BINDGEN=$(if $(BINDGEN),$(BINDGEN),$$HOME/.cache/emp/bindgen/bin/bindgen) modules

vm-test: build
	@scripts/vm/suite.sh

netns-test: build
	@scripts/netns/suite.sh

KFUZZ_CALLS ?= 1000000
KFUZZ_THREADS ?= 4
kfuzz: build
	@scripts/vm/kfuzz.sh --calls $(KFUZZ_CALLS) --threads $(KFUZZ_THREADS) $(if $(KFUZZ_SEED),--seed $(KFUZZ_SEED))

all: build

setup:
	@scripts/setup.sh

firmware: setup
	@scripts/fw-image.sh

# libemp.so.1, the C library with versioned symbols, is linked from libemp's
# staticlib into target/release/lib/ (scripts/libemp-link.sh says why); the
# libfabric provider libemp-fi.so goes next to it (fabric/build.sh).
build: firmware
	$(CARGO) build --release --workspace --bins --examples --lib
	@scripts/libemp-link.sh
	@fabric/build.sh

# The driver is formatted with the same rustfmt.toml (rustfmt follows its mod tree).
fmt:
	$(CARGO) fmt --all
	rustfmt --edition 2021 --config-path rustfmt.toml driver/emp_main.rs

lint:
	$(CARGO) fmt --all --check
	rustfmt --check --edition 2021 --config-path rustfmt.toml driver/emp_main.rs
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet
	python3 scripts/dev/modcycles.py

test: build lint
	$(CARGO) test --workspace --no-fail-fast
	@scripts/netns/suite.sh
	@scripts/vm/suite.sh

# Where things go. The firmware, the module and the udev rule go where the
# kernel and udev look for them, whatever PREFIX is: request_firmware() searches
# /lib/firmware (the driver asks for emp/emp-fw.bin), udev reads
# /lib/udev/rules.d (an admin's /etc/udev/rules.d/60-emp.rules overrides).
# Installed emp-nicd/`emp cluster up` trust the keys in /lib/firmware/emp
# (emp_config::trusted_keys_dir): a fixed place, not the image's directory.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
FIRMWAREDIR ?= /lib/firmware
UDEVRULESDIR ?= /lib/udev/rules.d
EMP_GROUP ?= emp
EMP_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# emp.ko (if `make driver` built it) goes to the modules of the kernel it
# was built for (its vermagic), not necessarily the running one.
KO := driver/emp.ko
KVER ?= $(shell [ -f $(KO) ] && /sbin/modinfo -F vermagic $(KO) 2>/dev/null | cut -d' ' -f1)
MODULEDIR ?= /lib/modules/$(KVER)/extra
REL := $(if $(CARGO_TARGET_DIR),$(CARGO_TARGET_DIR),target)/release

# Installs what is built; builds nothing (run `make build` first, as the
# user who owns the tree), so `sudo make install` never writes to target/.
# Idempotent: every file is replaced in place, the symlink re-pointed.
install:
	@for f in $(REL)/emp $(REL)/emp-nicd $(REL)/lib/libemp.so.1 firmware-blobs/emp-fw.bin; do \
		[ -f "$$f" ] || { echo "install: $$f is not built: run \`make build\` first" >&2; exit 1; }; \
	done
	@ls firmware-blobs/*.pub >/dev/null 2>&1 || { echo "install: no trusted key (firmware-blobs/*.pub): run \`make firmware\`" >&2; exit 1; }
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(INCLUDEDIR)" "$(DESTDIR)$(PKGCONFIGDIR)" \
		"$(DESTDIR)$(FIRMWAREDIR)/emp" "$(DESTDIR)$(UDEVRULESDIR)"
	install -m 0755 $(REL)/emp $(REL)/emp-nicd "$(DESTDIR)$(BINDIR)/"
	install -m 0755 $(REL)/lib/libemp.so.1 "$(DESTDIR)$(LIBDIR)/libemp.so.1"
	ln -sfn libemp.so.1 "$(DESTDIR)$(LIBDIR)/libemp.so"
	install -m 0644 libemp/include/emp.h "$(DESTDIR)$(INCLUDEDIR)/emp.h"
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
		'Name: emp' 'Description: EMP verbs library: OS-bypass message passing on an EMP NIC' \
		'Version: $(EMP_VERSION)' 'Libs: -L$${libdir} -lemp' 'Cflags: -I$${includedir}' \
		> "$(DESTDIR)$(PKGCONFIGDIR)/emp.pc"
	chmod 0644 "$(DESTDIR)$(PKGCONFIGDIR)/emp.pc"
	install -m 0644 firmware-blobs/emp-fw.bin firmware-blobs/*.pub "$(DESTDIR)$(FIRMWAREDIR)/emp/"
	sed 's/GROUP="emp"/GROUP="$(EMP_GROUP)"/' driver/udev/60-emp.rules > "$(DESTDIR)$(UDEVRULESDIR)/60-emp.rules"
	chmod 0644 "$(DESTDIR)$(UDEVRULESDIR)/60-emp.rules"
	@if [ -f $(KO) ]; then \
		[ -n "$(KVER)" ] || { echo "install: cannot read the kernel release of $(KO) (modinfo)" >&2; exit 1; }; \
		echo "install -D -m 0644 $(KO) $(DESTDIR)$(MODULEDIR)/emp.ko"; \
		install -D -m 0644 $(KO) "$(DESTDIR)$(MODULEDIR)/emp.ko"; \
	else \
		echo "install: $(KO) not built (make driver): no kernel module installed"; \
	fi
	@# On the live system only: the module index, the group, the libraries'
	@# cache, udev's rules. A staged tree (DESTDIR) is left to its packager.
	@if [ -z "$(DESTDIR)" ]; then \
		if [ -f $(KO) ]; then /sbin/depmod -a $(KVER); fi; \
		getent group $(EMP_GROUP) >/dev/null || groupadd --system $(EMP_GROUP); \
		/sbin/ldconfig; \
		if [ -d /run/udev ] && command -v udevadm >/dev/null; then \
			udevadm control --reload && udevadm trigger --subsystem-match=misc --sysname-match='emp-nic*'; \
		fi; \
	fi

demo: build
	@scripts/demo.sh

clean:
	$(CARGO) clean
