"""Students at GPU scale inside one lent GPU (15 minutes in all, 64 MiB per transfer each way).

stage.py     here, on a CPU: the teacher (split in two parts), the train prompts as token ids, the
             calibration and held-out blocks, written into the two folders the two calls carry
students.py  on the GPU (or a CPU, as the suite's dry-run): the teacher's replies, the 8B-shaped
             trainer measurement, then every student trained in parallel, snapshots under --out
student.py   one student's process: lstsq init, packed blocks, the trainer's steps, snapshots
snapshot.py  what a loan brings back: trained tensors in files under the transfer's size limit, the
             run's progress in their metadata; `install` turns one into a distilled folder
profile.py   a few steps under torch's profiler after the first speed line: where a step's time goes
shape.py     the users' number: the trainer on a randomly initialised model of a given shape
replies.py   here again: a loan's replies merged into the reply file CPU runs and the next stage read
"""
