#!/bin/bash
# Verifier of 02-count-todos (runs as root, the image's default user, whatever the agent user was: USR-3).
source /tests/lib.sh
reward_if_same /app/report/todo-count.txt /tests/expected-todo-count.txt
