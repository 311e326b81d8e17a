#!/usr/bin/env bash
# mlp_classifier on CSV files as users have them: iris with class names, a NaN cell, a label of a
# million, semicolons and quoted fields with commas. Exit status and output are both checked.
#   csv_test.sh MLP_CLASSIFIER EXPECT_SH
set -euo pipefail
mlp="$1" expect="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The first five examples of each class of Fisher's iris data, as iris.csv files write them.
cat > "$work/iris.csv" <<'CSV'
sepal_length,sepal_width,petal_length,petal_width,species
5.1,3.5,1.4,0.2,setosa
4.9,3.0,1.4,0.2,setosa
4.7,3.2,1.3,0.2,setosa
4.6,3.1,1.5,0.2,setosa
5.0,3.6,1.4,0.2,setosa
7.0,3.2,4.7,1.4,versicolor
6.4,3.2,4.5,1.5,versicolor
6.9,3.1,4.9,1.5,versicolor
5.5,2.3,4.0,1.3,versicolor
6.5,2.8,4.6,1.5,versicolor
6.3,3.3,6.0,2.5,virginica
5.8,2.7,5.1,1.9,virginica
7.1,3.0,5.9,2.1,virginica
6.3,2.9,5.6,1.8,virginica
6.5,3.0,5.8,2.2,virginica
CSV

# Class names map to ids, printed and saved beside the checkpoints; one step an epoch reads so.
"$expect" 0 --match "data: .*iris\.csv \(15 examples, 4 features, 3 classes\)" \
  --match "classes: 0=setosa 1=versicolor 2=virginica" --match "global batch 15, 1 step per epoch" \
  --match "Epoch 1/40: 1 step, loss" --no-match "1 steps" --no-match "0\.000 s" --match "accuracy=1\.0000" -- \
  "$mlp" --csv "$work/iris.csv" --label-column species --epochs 40 --batch 15 --replicas 3 \
  --checkpoint-dir "$work/ck" --min-accuracy 0.9
[[ "$(cat "$work/ck/labels.txt")" == $'setosa\nversicolor\nvirginica' ]] || {
  echo "csv_test: $work/ck/labels.txt holds: $(cat "$work/ck/labels.txt")" >&2
  exit 1
}
# Resuming on data whose classes map differently is refused.
sed 's/virginica/zebra/' "$work/iris.csv" > "$work/iris_other.csv"
"$expect" 1 --match "mlp_classifier: --resume: .*ck/labels\.txt maps the classes differently from .*iris_other\.csv" -- \
  "$mlp" --csv "$work/iris_other.csv" --label-column species --batch 15 --checkpoint-dir "$work/ck" --resume

# Excel's "CSV UTF-8" starts with a byte-order mark: read as if it were not there.
printf '\xEF\xBB\xBF' | cat - "$work/iris.csv" > "$work/iris_bom.csv"
"$expect" 0 --match "\(15 examples, 4 features, 3 classes\)" --match "classes: 0=setosa 1=versicolor 2=virginica" -- \
  "$mlp" --csv "$work/iris_bom.csv" --label-column species --epochs 1 --batch 15 --replicas 1

# A NaN cell: refused with file, line and column and the flag that drops such rows; or the row
# dropped with a warning.
sed '4s/^4\.7,3\.2/4.7,nan/' "$work/iris.csv" > "$work/iris_nan.csv"
"$expect" 1 --match "mlp_classifier: .*iris_nan\.csv:4: column 1 \(\"sepal_width\"\): \"nan\" is not a finite number" \
  --match "drop such rows: --non-finite=drop" --no-match "NonFinite::" -- \
  "$mlp" --csv "$work/iris_nan.csv" --label-column species --epochs 1
"$expect" 0 --match "mlp_classifier: warning: .*iris_nan\.csv:4: column 1 \(\"sepal_width\"\): \"nan\" is not a finite number: row dropped" \
  --match "\(14 examples, 4 features, 3 classes\)" -- \
  "$mlp" --csv "$work/iris_nan.csv" --label-column species --epochs 1 --non-finite=drop

# A label of a million would make a million classes: an error unless asked for.
printf 'x,label\n1,0\n2,1000000\n' > "$work/huge.csv"
"$expect" 1 --match "label 1000000 would make 1000001 classes, more than --max-classes 1000" -- \
  "$mlp" --csv "$work/huge.csv" --epochs 1
printf 'x,label\n1,0\n2,2000\n' > "$work/wide.csv"
"$expect" 0 --match "\(2 examples, 1 features, 2001 classes\)" -- \
  "$mlp" --csv "$work/wide.csv" --epochs 1 --batch 2 --replicas 1 --hidden 8 --max-classes 3000

# Semicolons, and quoted fields holding the delimiter and quotes (RFC 4180).
printf 'a;b;"kind; long"\n1;2;"x; ""one"""\n3;4;y\n1.5;2.5;"x; ""one"""\n3.5;4.5;y\n' > "$work/semi.csv"
"$expect" 0 --match "classes: 0=x; \"one\" 1=y" --match "\(4 examples, 2 features, 2 classes\)" -- \
  "$mlp" --csv "$work/semi.csv" --label-column "kind; long" --delimiter ";" --epochs 1 --batch 4 --replicas 2
# Without --delimiter, the error says to pass it.
"$expect" 1 --match "mlp_classifier: .*semi\.csv.*the file looks semicolon-separated; pass --delimiter ';'" -- \
  "$mlp" --csv "$work/semi.csv" --label-column "kind; long" --epochs 1
tr ',' '\t' < "$work/iris.csv" > "$work/iris.tsv"
"$expect" 1 --match "the file looks tab-separated; pass --delimiter tab" -- \
  "$mlp" --csv "$work/iris.tsv" --label-column species --epochs 1
"$expect" 0 --match "\(15 examples, 4 features, 3 classes\)" -- \
  "$mlp" --csv "$work/iris.tsv" --label-column species --delimiter tab --epochs 1 --batch 15 --replicas 1
"$expect" 2 --match "--delimiter: expected one character or \"tab\", got \"ab\"" -- \
  "$mlp" --csv "$work/semi.csv" --delimiter ab
printf '1,"2\n' >> "$work/iris_open.csv"
"$expect" 1 --match "iris_open\.csv:1: the quoted field opened at character 3 is not closed on this line" -- \
  "$mlp" --csv "$work/iris_open.csv"
echo "csv_test: every check passed"
