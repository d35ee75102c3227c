import sys

from stevora.settings import Settings
from workers.main import run

settings = Settings()
sys.exit(run(settings, processes=settings.worker_processes, threads=settings.worker_threads))
