# One image for every Stevora process: `stevora api`, `stevora worker`, `stevora migrate`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md alembic.ini ./
COPY stevora ./stevora
COPY workers ./workers
COPY migrations ./migrations
COPY examples ./examples
RUN pip install -e ".[server]" && useradd --create-home stevora
USER stevora

EXPOSE 3000
CMD ["stevora", "api", "--host", "0.0.0.0", "--port", "3000"]
