FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY afterthought ./afterthought
COPY agent_hooks ./agent_hooks
COPY worker ./worker
COPY examples ./examples
RUN pip install --no-cache-dir ".[db]" && useradd --create-home afterthought \
    && mkdir /data && chown afterthought /data
USER afterthought
CMD ["afterthought", "worker"]
