# The browser service for env `browser_docker`: the browser runtime (Chromium driven by Playwright's Python API;
# docker/browser-runtime.Dockerfile) plus this project's packages. Nothing is pulled: RUNTIME is a local image.
#   python -m testbed.images build browser
# then in the agent config:  env: {name: browser_docker, image: dah-browser}
ARG RUNTIME
FROM ${RUNTIME}
COPY app/ /app/
ENV PYTHONPATH=/app
WORKDIR /app
EXPOSE 9300
# The token comes from DAH_BROWSER_TOKEN (set by BrowserDockerEnv); the command is given by it too.
CMD ["python", "-m", "agent.envs.browser_service", "--host", "0.0.0.0", "--port", "9300"]
