from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, logging_config
from settings.env import env_int

ROLE = "executor"
SERVICE_NAME = "executor"
INSTALLED_APPS = [*BASE_APPS, "executor"]
ROOT_URLCONF = "dlock.urls"
DATABASES: dict = {}  # the worker speaks HTTP only
LOGGING = logging_config(SERVICE_NAME)

# Payouts in flight at once in one run_executor process, each on its own account
# (docs/executor.md "Concurrency"). 1 is the one-at-a-time executor.
EXECUTOR_CONCURRENCY = env_int("EXECUTOR_CONCURRENCY", 1, minimum=1, maximum=256)
# On SIGTERM: how long in-flight sections may take to finish or abandon before the session is
# closed. Below k8s terminationGracePeriodSeconds (30) minus the rail submit budget margin.
EXECUTOR_DRAIN_BUDGET_S = env_int("EXECUTOR_DRAIN_BUDGET_S", 20, minimum=1, maximum=600)
