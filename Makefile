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
#   make demo      the main job: a 4-NIC chassis, latency and bandwidth
#   make lint      rustfmt (workspace and driver), clippy -D warnings, rustdoc
#                  -D warnings, no module cycles; part of make test
#   make fmt       format the workspace and the driver
#   make firmware  (re)build firmware-blobs/emp-fw.bin, signed with the
#                  development key (generated once, never committed)
CARGO ?= cargo

.PHONY: all build firmware test demo setup clean driver kernel vm-test netns-test lint fmt

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

all: build

setup:
	@scripts/setup.sh

firmware: setup
	@scripts/fw-image.sh

# libemp.so.1, the C library with versioned symbols, is linked from libemp's
# staticlib into target/release/lib/ (scripts/libemp-link.sh says why).
build: firmware
	$(CARGO) build --release --workspace --bins --examples --lib
	@scripts/libemp-link.sh

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

demo: build
	@scripts/demo.sh

clean:
	$(CARGO) clean
