# One image for every Stevora process: `stevora api`, `stevora worker`, `stevora migrate`.
# Stage 1 builds the wheel (it carries the Alembic scripts and the demo's examples as package
# data); stage 2 installs only that wheel, so the image runs what `pip install` users run.
FROM python:3.11-slim AS build

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY stevora ./stevora
COPY workers ./workers
COPY migrations ./migrations
COPY examples ./examples
RUN pip wheel --no-deps --wheel-dir /dist .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY --from=build /dist /dist
RUN pip install "$(ls /dist/*.whl)[server]" && rm -rf /dist && useradd --create-home stevora
USER stevora

EXPOSE 3000
CMD ["stevora", "api", "--host", "0.0.0.0", "--port", "3000"]
