# The browser service for env `browser_docker`: Debian's Chromium driven by Playwright's Python API.
#   docker build -f agent/envs/browser.Dockerfile -t dah-browser .
# then in the agent config:  env: {name: browser_docker, image: dah-browser}
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends chromium fonts-dejavu-core \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir playwright==1.65.2
WORKDIR /app
COPY agent ./agent
ENV PYTHONPATH=/app
EXPOSE 9300
# The token comes from DAH_BROWSER_TOKEN (set by BrowserDockerEnv); the command is given by it too.
CMD ["python", "-m", "agent.envs.browser_service", "--host", "0.0.0.0", "--port", "9300"]
