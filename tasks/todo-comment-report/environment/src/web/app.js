// TODO(carol): switch to fetch API
function load(url) {
  return $.get(url); // FIXME(alice): no error handling
}
/* TODO: block comments are out of scope */
const s = "// TODO: inside a string is still reported (simple scanner)";
