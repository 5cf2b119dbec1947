# The browser service's runtime: the runtime image plus this host's Chromium (Debian's chromium package and its
# dependencies, copied from this machine; see testbed/images.py) and Playwright. Nothing is pulled.
ARG RUNTIME
FROM ${RUNTIME}
COPY browser/ /
