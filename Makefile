# EMP top-level entry points.
#   make        build everything (release)
#   make test   every test: unit, property, C layout, simulation suite
#   make demo   the main job: a seeded 8-NIC simulation with loss
CARGO ?= cargo

.PHONY: all build test demo setup clean

all: build

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

test: setup
	$(CARGO) test --workspace --no-fail-fast

demo: build
	./target/release/emp-sim --nodes 8 --loss 0.05 --seed 42 --messages 10000

clean:
	$(CARGO) clean
