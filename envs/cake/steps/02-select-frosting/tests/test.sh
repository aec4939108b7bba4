#!/bin/bash
# Verifier of step 02-select-frosting: the frosting is right and the base from turn 1 is still there.
mkdir -p /logs/verifier
if [ "$(cat /app/cake/frosting.txt 2>/dev/null)" = "vanilla-buttercream" ] \
   && [ "$(cat /app/cake/base.txt 2>/dev/null)" = "chocolate" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "expected frosting.txt = 'vanilla-buttercream' and base.txt = 'chocolate'"
  echo 0 > /logs/verifier/reward.txt
fi
