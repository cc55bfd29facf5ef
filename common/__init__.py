"""The ground floor: helpers every Lifeline process shares (logs, clock, errors,
request-body parsing, detokenization). It imports no other Lifeline package."""
