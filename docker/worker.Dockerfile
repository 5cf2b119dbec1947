# The worker image: the runtime image (this host's Debian files, the harness's Python and its dependencies;
# see testbed/images.py) plus this project's packages. Nothing is pulled: RUNTIME is a local image.
#   python -m testbed.images build worker
ARG RUNTIME
FROM ${RUNTIME}
COPY app/ /app/
ENV PYTHONPATH=/app
WORKDIR /app
CMD ["python", "-m", "testbed", "--help"]
