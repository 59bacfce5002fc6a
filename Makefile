# co2: the two commands a fresh Debian bookworm machine needs are
#   make demo   (installs, builds, trains Fashion-MNIST with CO2 vs DDP)
#   make test   (installs, builds, runs the test suite CI runs)
SHELL := /bin/bash
BUILD ?= build
BUILD_TSA ?= build-tsa
JOBS ?= $(shell nproc)
CTEST_ARGS ?=
# ccache hits across clones in other directories (CI builds a fresh clone).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

# Every Debian package the project needs.
PACKAGES := build-essential cmake ninja-build ccache pkg-config git \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev libabsl-dev zlib1g-dev \
  libgtest-dev libgmock-dev libbenchmark-dev libtorch-dev libgloo-dev \
  prometheus-cpp-dev prometheus dataset-fashion-mnist fortunes \
  iperf3 iproute2 iputils-ping gnuplot-nox libnetfilter-queue-dev \
  clang libclang-rt-14-dev openssl libssl-dev curl
# LibTorch's CPU matrix products go through the system BLAS, which is
# Debian's reference implementation unless an optimised one is installed:
# OpenBLAS (its OpenMP build follows co2-train --threads) makes the demo's
# training 2 x and the wide model's steps 5 x faster (docs/performance.md).
PACKAGES += libopenblas0-openmp
# deploy/ checks (tests/deploy_test.py): python3-yaml, promtool (prometheus),
# and Debian's kubectl unless a kubectl is already on PATH (another vendor's
# package owns /usr/bin/kubectl then, and the two cannot both be installed).
PACKAGES += python3-yaml $(if $(shell command -v kubectl 2>/dev/null),,kubernetes-client)
# The long container tests (tests/container_image_test.sh, compose_test.sh):
# root podman with runc, iptables for its bridge network, mmdebstrap for the
# debian:bookworm base where no registry can be reached.
PACKAGES += podman runc iptables uidmap mmdebstrap
# The Python package (python/, docs/python.md): Debian's torch for
# /usr/bin/python3, pybind11 to build its extension, pytest for its tests;
# venv for the suite's second run on PyPI's torch 2.x (scripts/torch_venv.sh)
# and the wheel test's tools.
PACKAGES += python3-dev python3-torch python3-numpy pybind11-dev python3-pytest python3-venv
# Installed without their Recommends: docker-compose's would pull in the
# Docker engine, which nothing here runs (`docker-compose config` needs none).
PACKAGES_NO_RECOMMENDS := docker-compose

.PHONY: deps configure build thread-safety test test-long test-all demo bench clean

# Idempotent and quiet: apt runs only when a package is missing.
deps:
	@missing=$$(dpkg-query -W -f='$${Package} $${Status}\n' $(PACKAGES) 2>/dev/null \
	  | awk '$$NF=="installed"{print $$1}' | sort | comm -13 - <(tr ' ' '\n' <<<"$(PACKAGES)" | grep . | sort)); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing $$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@missing=$$(dpkg-query -W -f='$${Package} $${Status}\n' $(PACKAGES_NO_RECOMMENDS) 2>/dev/null \
	  | awk '$$NF=="installed"{print $$1}' | sort | comm -13 - <(tr ' ' '\n' <<<"$(PACKAGES_NO_RECOMMENDS)" | grep . | sort)); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing $$missing (without recommends)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# clang's -Wthread-safety over the libraries that carry ABSL_GUARDED_BY and
# lock annotations, warnings as errors (cmake/co2_thread_safety.cmake): a
# clang build of those units only, without LibTorch, tests or benchmarks.
$(BUILD_TSA)/build.ninja:
	CC=clang CXX=clang++ cmake -S . -B $(BUILD_TSA) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCO2_THREAD_SAFETY=ON -DCO2_WITH_TORCH=OFF -DCO2_BUILD_TESTS=OFF -DCO2_BUILD_BENCH=OFF

thread-safety: deps $(BUILD_TSA)/build.ninja
	cmake --build $(BUILD_TSA) -j $(JOBS) --target co2_thread_safety

# What CI runs: the thread-safety check, then everything but the suites
# labelled `long`. A test that skips (exit 77) prints a line "SKIP: why";
# those lines are shown after the run.
test: thread-safety build
	cd $(BUILD) && { ctest -LE long --output-on-failure -j $(JOBS) $(CTEST_ARGS); status=$$?; \
	  grep -h '^SKIP: ' Testing/Temporary/LastTest*.log 2>/dev/null | sort -u; exit $$status; }

test-long: build
	cd $(BUILD) && ctest -L long --output-on-failure $(CTEST_ARGS)

test-all: build
	cd $(BUILD) && ctest --output-on-failure $(CTEST_ARGS)

# Fashion-MNIST, 4 workers: CO2 and then DDP, final test accuracy side by side
# (scripts/demo.sh; DEMO_ARGS adds co2-train flags to both runs).
# Builds only co2-train (the tests and benchmarks are left for `make test`).
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target co2-train
	scripts/demo.sh $(BUILD) $(DEMO_ARGS)

bench: build
	bench/run_all.sh $(BUILD)

# The GPU check's prepared folder, build-gpu-check/, which travels to a bare
# GPU machine beside the tree; there scripts/gpu_check.sh runs (docs/gpu-check.md).
.PHONY: gpu-check-prepare
gpu-check-prepare: deps
	scripts/gpu_check_prepare.sh

clean:
	rm -rf $(BUILD) $(BUILD_TSA)
