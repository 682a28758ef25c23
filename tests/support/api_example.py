import jobgen.api as jobgen

sets = ["train.epochs=1", "train.deterministic=true", "data.partition=[601, 101, 151]"]  # a quick try
exp = jobgen.load("experiments/local_demo.toml", sets=sets)
print(exp.name, [job.name for job in jobgen.plan(exp)])

run = jobgen.submit(exp)  # the local backend runs the jobs here; on Slurm it returns once they are queued
states = run.wait(timeout=3600)  # job name -> final state, as `jobgen status --watch` ends
print(states)

rows = run.results()  # one dict per row of `jobgen summary --format csv`, the same columns
for row in rows:
    print(row["config"], row["state"], row["train_s"], row["test_acc"])

again = run.rerun(["engine-torch"])  # a new run from this one's record: same spec, seed, code snapshot
assert again.rerun_of == run.run_id
assert again.results()[0]["test_acc"] == rows[0]["test_acc"]

table = run.to_pandas()  # with pandas installed
print(table[["config", "train_s", "test_acc"]])
