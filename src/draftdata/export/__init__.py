"""export stage: a run's completions -> the drafter trainers' formats, OpenAI messages, parquet."""
