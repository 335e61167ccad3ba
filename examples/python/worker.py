"""A Python worker for create_mysql_instance.yaml: python3 worker.py [SERVER_URL]."""

import logging
import sys

from starbridge import NonRetryable, Task, Worker

worker = Worker(sys.argv[1] if len(sys.argv) > 1 else None, concurrency=16)


@worker.handler("resource", "check_resource")
def check_resource(task: Task) -> dict:
    return {"host": "db-7.internal"}


@worker.handler("mysql", "init_instance")
def init_instance(task: Task) -> dict:
    task.log("initialising", host=task.input["host"], storage_gb=task.input["storage"])
    return {"instance_id": "i-" + task.job_id[-8:]}


@worker.handler("resource", "deduct_resource")
async def deduct_resource(task: Task) -> dict:
    if task.input["storage"] > 600:  # sync and async handlers alike
        raise NonRetryable(f"quota exhausted: {task.input['storage']} GB asked, 600 GB left")
    return {"deducted_gb": task.input["storage"]}


# Compensations get the task they undo: {id, step, status, input, output, error}.
@worker.handler("mysql", "clean_instance")
def clean_instance(task: Task) -> dict:
    return {"removed": task.input["output"]["instance_id"]}


@worker.handler("resource", "restore_resource")
def restore_resource(task: Task) -> dict:
    undone = task.input
    return {"restored_gb": undone["output"]["deducted_gb"] if undone["status"] == "succeeded" else 0}


@worker.handler("monitor", "report_event")
def report_event(task: Task) -> dict:
    return {"reported": f"rolled back after {task.input['step']}"}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not every request
    worker.run()  # until SIGTERM or Ctrl-C, then a graceful stop
