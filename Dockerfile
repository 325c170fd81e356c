# grm-service on NVIDIA GPUs, on top of the official vLLM OpenAI server image (CUDA, PyTorch and
# vLLM already built and tested together). Build: docker build -t grm-service:gpu .
# Run:  docker run --gpus all --ipc=host -v /srv/models:/models:ro -e GRM_MODEL=/models/rm \
#         -e GRM_SERVED_MODEL_NAME=rm -p 8000:8000 grm-service:gpu
# Every setting is an env var GRM_<FIELD> (grm_service/config.py); see docs/deployment.md.
ARG VLLM_TAG=v0.32.0
FROM vllm/vllm-openai:${VLLM_TAG}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# vLLM comes from the base image, so install grm-service without the [gpu] extra: pip then keeps
# the image's vllm and torch instead of resolving its own.
WORKDIR /opt/grm-service
COPY pyproject.toml README.md ./
COPY grm_service ./grm_service
RUN python3 -m pip install --no-cache-dir . \
    && python3 -c "import grm_service.cli, vllm"
COPY --chmod=0755 deploy/entrypoint.sh /usr/local/bin/grm-entrypoint

# A fixed non-root uid, so a model volume can be made readable to it alone.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin grm \
    && mkdir -p /models /cache \
    && chown grm:grm /cache
USER 10001:10001

# /models: model folders (read-only is enough); /cache: HF cache, model hashes, replica logs,
# torch.compile caches (a volume keeps compiled graphs across restarts).
ENV GRM_HOST=0.0.0.0 \
    GRM_PORT=8000 \
    GRM_ENGINE=vllm \
    GRM_CACHE_DIR=/cache/grm \
    GRM_WORK_DIR=/cache/grm/run \
    HF_HOME=/cache/huggingface \
    VLLM_NO_USAGE_STATS=1
VOLUME ["/models", "/cache"]
EXPOSE 8000

# The start period covers model load and CUDA graph capture of every replica.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 \
    CMD ["grm-entrypoint", "healthcheck"]
ENTRYPOINT ["grm-entrypoint"]
CMD ["serve"]
