# zmq_rl image (CPU): every console script of the package, for any role.
#
#   docker build -t zmq-rl:0.1.0 .
#   docker run --rm -p 5555-5557:5555-5557 -v "$PWD/runs:/runs" zmq-rl:0.1.0 \
#       zmq-learner --host 0.0.0.0 --env CartPole-v1 --actors 2 --run-dir /runs/cartpole
#   docker run --rm zmq-rl:0.1.0 zmq-actor --learner LEARNER_HOST:5555
#
# The learner binds 5555 (control), 5556 (experience) and 5557 (weights); actors open no
# port. CUDA variant (docs/clusters.md): the CUDA wheels of torch bring the CUDA runtime
# with them, so the same base does, with the host's NVIDIA driver and container toolkit:
#   docker build -t zmq-rl:0.1.0-cu126 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 .
#   docker run --gpus all ...
# (The learner trains on the CPU today; the CUDA image is for a device option to come
# and for custom policies that use one.)
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

# torch from the CPU wheel index first (the default index would fetch the CUDA build,
# gigabytes larger), then zmq_rl with its learner extra (classic-control envs; add
# extras for others). Actors need none of torch: Dockerfile.actor is their slim image.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1

RUN python -m pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

WORKDIR /opt/zmq_rl
COPY pyproject.toml setup.cfg README.md ./
COPY bin/zmq-rl-tmux bin/zmq-rl-tmux
COPY zmq_rl zmq_rl
RUN python -m pip install '.[learner]'

# Not root; run dirs go to /runs (mount a volume there).
RUN useradd --create-home --uid 1000 rl && mkdir /runs && chown rl /runs
USER rl
WORKDIR /runs
EXPOSE 5555 5556 5557

# Any console script: zmq-rl (run, eval, plot, keys, slurm, ray), zmq-learner, zmq-actor.
CMD ["zmq-rl", "--help"]
