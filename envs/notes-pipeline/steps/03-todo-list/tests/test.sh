#!/bin/bash
# Verifier of 03-todo-list; with the "final" roll-up its reward is the episode reward (RWD-8).
source /tests/lib.sh
reward_if_same /app/report/todo.txt /tests/expected-todo.txt
