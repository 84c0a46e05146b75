// tests/cpu/test_run_all.cpp: tests/run_all.sh, which sums make test's runs into its closing line,
// on stand-in suites: shell scripts that print doctest's summary lines (the formats of doctest
// 2.4: "[doctest] test cases: ...", and --count's "... passing the current filters: N") and exit
// as a suite would. Both ways make runs it are checked: all runs side by side, and each run alone
// with --one then --summary (make test's targets), which must agree to the line.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../common/cli_util.h"

namespace fs = std::filesystem;

namespace {

void script(const fs::path& p, const std::string& body) {
  {
    std::ofstream f(p);
    f << "#!/usr/bin/env bash\n" << body;
  }
  fs::permissions(p, fs::perms::owner_all);
}

std::string last_line(const std::string& s) {
  const size_t end = s.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t start = s.rfind('\n', end);
  return s.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace

TEST_CASE("run_all.sh: passed, failed and skipped summed over the runs; a crash or a bad exit is one failure; --one and --summary agree") {
  const fs::path d = cli::fresh_dir("tg_run_all");
  fs::create_directories(d);
  // a suite that passes with one case skipped
  script(d / "pass.sh", "echo '[doctest] test cases: 5 | 4 passed | 0 failed | 1 skipped'\n");
  // two cases failing: exit 1, as doctest's, after its seed line and an error block
  script(d / "fail.sh",
         "echo '[test_gpu] random inputs seeded with TG_TEST_SEED=424242'\n"
         "echo '==============================================================================='\n"
         "echo 'x.cpp:5:'\necho 'TEST CASE:  a case that fails'\necho\n"
         "echo 'x.cpp:7: ERROR: CHECK( a == 2 ) is NOT correct!'\n"
         "echo '==============================================================================='\n"
         "echo 'a passing case printing a message'\n"
         "echo '==============================================================================='\n"
         "echo '[doctest] test cases: 3 | 1 passed | 2 failed | 0 skipped'\nexit 1\n");
  // killed before its summary (a segmentation fault: 139)
  script(d / "crash.sh", "echo 'half a run'\nexit 139\n");
  // every case passed, yet a non-zero exit (a sanitizer's report at exit, say)
  script(d / "badexit.sh", "echo '[doctest] test cases: 2 | 2 passed | 0 failed | 0 skipped'\nexit 3\n");
  // part of a binary's cases (--no-skipped-summary): 7 match the filter, 5 of them unskipped
  script(d / "part.sh",
         "case \"$*\" in\n"
         "  *--count*--no-skip*) echo '[doctest] unskipped test cases passing the current filters: 7' ;;\n"
         "  *--count*) echo '[doctest] unskipped test cases passing the current filters: 5' ;;\n"
         "  *) echo '[doctest] test cases: 5 | 5 passed | 0 failed |' ;;\n"
         "esac\n");
  // a run's VAR=value words reach it
  script(d / "env.sh",
         "[ \"$TG_RUN_ALL_CHECK\" = yes ] || exit 1\necho '[doctest] test cases: 1 | 1 passed | 0 failed | 0 skipped'\n");

  const std::string pass = (d / "pass.sh").string(), fail = (d / "fail.sh").string(), crash = (d / "crash.sh").string(),
                    badexit = (d / "badexit.sh").string(), part = (d / "part.sh").string(), env = (d / "env.sh").string();
  const std::string part_run = part + " --no-skipped-summary --source-file=*x.cpp";
  const std::string env_run = "TG_RUN_ALL_CHECK=yes " + env;

  SUBCASE("every run passing") {
    const std::string runs = "'" + pass + "' '" + part_run + "' '" + env_run + "'";
    const cli::Run side = cli::run_exe("bash", "tests/run_all.sh " + runs);
    CHECK(side.code == 0);
    CHECK(last_line(side.out) == "10 passed, 0 failed, 3 skipped");
    const fs::path logs = d / "logs_ok";
    CHECK(cli::run_exe("bash", "tests/run_all.sh --one " + logs.string() + " a '" + pass + "'").code == 0);
    CHECK(cli::run_exe("bash", "tests/run_all.sh --one " + logs.string() + " b '" + part_run + "'").code == 0);
    CHECK(cli::run_exe("bash", "tests/run_all.sh --one " + logs.string() + " c '" + env_run + "'").code == 0);
    const cli::Run sum = cli::run_exe(
        "bash", "tests/run_all.sh --summary " + logs.string() + " a '" + pass + "' b '" + part_run + "' c '" + env_run + "'");
    CHECK(sum.code == 0);
    CHECK(last_line(sum.out) == last_line(side.out));
  }

  SUBCASE("failures, a crash and a bad exit") {
    const std::string runs = "'" + pass + "' '" + fail + "' '" + crash + "' '" + badexit + "' '" + env + "'";
    const cli::Run side = cli::run_exe("bash", "tests/run_all.sh " + runs);
    CHECK(side.code != 0);
    // pass 4 + fail 1 + badexit 2; fail's 2 + the crash + the bad exit + env.sh without its variable
    // (exit 1, no summary)
    CHECK(last_line(side.out) == "7 passed, 5 failed, 1 skipped");
    CHECK(side.out.find("exited with 139 and printed no doctest summary") != std::string::npos);
    CHECK(side.out.find("exited with 3 although no test case failed") != std::string::npos);
    // what failed, again after the logs, just above the closing line: each failing run's command,
    // its seed and error blocks (not the blocks without an error), a crash's last lines; not the
    // runs that passed
    const std::string tail = side.out.substr(side.out.find("== what failed"));
    CHECK(tail.find("-- " + fail + " (exit status 1)\n[test_gpu] random inputs seeded with TG_TEST_SEED=424242\n"
                    "x.cpp:5:\nTEST CASE:  a case that fails\n\nx.cpp:7: ERROR: CHECK( a == 2 ) is NOT correct!\n") !=
          std::string::npos);
    CHECK(tail.find("a passing case printing a message") == std::string::npos);
    CHECK(tail.find("-- " + crash + " (exit status 139)\nhalf a run\n") != std::string::npos);
    CHECK(tail.find("-- " + badexit + " (exit status 3)") != std::string::npos);
    CHECK(tail.find("-- " + pass + " ") == std::string::npos);
    const fs::path logs = d / "logs_bad";
    const std::string names[] = {"p", "f", "c", "b", "e"};
    const std::string bins[] = {pass, fail, crash, badexit, env};
    std::string pairs;
    for (int i = 0; i < 5; ++i) {
      // --one always exits 0: the run's own status is kept for the summary
      CHECK(cli::run_exe("bash", "tests/run_all.sh --one " + logs.string() + " " + names[i] + " '" + bins[i] + "'").code == 0);
      pairs += " " + names[i] + " '" + bins[i] + "'";
    }
    const cli::Run sum = cli::run_exe("bash", "tests/run_all.sh --summary " + logs.string() + pairs);
    CHECK(sum.code != 0);
    CHECK(last_line(sum.out) == last_line(side.out));
    // a run whose log is missing (its target never ran) is one failure, not a pass
    const cli::Run missing = cli::run_exe("bash", "tests/run_all.sh --summary " + logs.string() + " p '" + pass + "' z '" + pass + "'");
    CHECK(missing.code != 0);
    CHECK(last_line(missing.out) == "4 passed, 1 failed, 1 skipped");
  }
  fs::remove_all(d);
}
