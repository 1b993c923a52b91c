"""Wire contracts of the services by concern (fields, jobs, core mirrors, broker, membership, answers, errors);
`megha.common.models` re-exports them all."""
