# The browser service for env `browser_docker`: the runtime image plus this host's Chromium (Debian's
# chromium package and its dependencies, copied from this machine) driven by Playwright's Python API.
#   python -m testbed.images build browser
# then in the agent config:  env: {name: browser_docker, image: dah-browser}
ARG RUNTIME
FROM ${RUNTIME}
COPY chromium/ /
COPY app/ /app/
ENV PYTHONPATH=/app
WORKDIR /app
EXPOSE 9300
# The token comes from DAH_BROWSER_TOKEN (set by BrowserDockerEnv); the command is given by it too.
CMD ["python", "-m", "agent.envs.browser_service", "--host", "0.0.0.0", "--port", "9300"]
