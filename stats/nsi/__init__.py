"""The negation paper's framing-stability statistics over NSI run tables (sections 3-5, appendices B-C).

    tables        reading nsi_replies / nsi_continuous as contract.tables declares them; the groups file
    cells         reply counts per model x dilemma x framing (the unit every statistic starts from)
    measures      NSI, its simulated nulls (dilemma rates, common rate, per dilemma), acquiescence, effect sizes (hand-written)
    intervals     cluster and nested CIs of the pooled-rate NSI and of pooled ratios
    tiers         audit tiers A/B/C of the point estimate, with the CI's conservative tier (Tables 6-7)
    rankings      NSI per model x dilemma, per model (Table 4), per model x domain (Tables 3, 7); temperature
    endorsement   endorsement by framing (Table 2), acquiescence, inter-model agreement, parse outcomes
    significance  Cochran's Q with Benjamini-Hochberg; Kruskal-Wallis and Mann-Whitney across groups
    continuous    the same NSI on the continuous readout p_endorse (this project's extension, untiered)
    analysis      analyze_nsi(): every table and headline, as data
    report        run_nsi_stats(): `readout nsi-stats`, writes them
    coding        the human-coding codebook and export (`readout nsi-export`)
    gold          gold labels against the binary proxy (`readout nsi-gold`)
    agreement     two-rater statistics: Wilson, Cohen's kappa, Krippendorff's alpha, Gwet's AC1, macro-F1
    figures       acquiescence scatter, NSI heatmap, agreement bars, proxy over-count and its composition
    synth         synthetic run directories with planted rates or exact counts (tests)

Definitions (the paper's symbols): endorsement a = d XOR neg(f), d = 1 for "agree", neg(f) = 1 for the
negated framings F1, F3 (eq. 1); parse failures are excluded (Appendix C.4) and counted in the parse table.
P_a^f is an endorsement rate under framing f. NSI = max_f P_a^f - min_f P_a^f (eq. 2), over {F0, F1}
(``nsi_01``) or all four framings (``nsi``). A model's NSI is eq. 2 on its rates pooled over its dilemmas,
corrected by a null in which each dilemma keeps its own rate (``null_mode="dilemma-rates"``, the default)
or one in which all its replies share one rate (``"common-rate"``), or the mean of its per-dilemma NSI with
per-dilemma nulls (``"per-dilemma"``); `measures` says which passage fixes each. Each
module's docstring gives the rest (CIs, tests, tiers, continuous readout).
Compute modules are pure; `report`, `coding.export_sample` and `gold.gold_report` write.
"""

from stats.core.errors import NSITableError
from stats.nsi.agreement import (
                                 Agreement,
                                 Proportion,
                                 agreement,
                                 alpha_bootstrap_ci,
                                 cohen_kappa,
                                 gwet_ac1,
                                 krippendorff_alpha,
                                 macro_f1,
                                 raw_agreement,
                                 wilson,
)
from stats.nsi.analysis import NsiAnalysis, NsiTable, analyze_nsi
from stats.nsi.cells import Cells, build_cells, continuous_arrays
from stats.nsi.coding import (
                                 ACTION_STANCE,
                                 AXES,
                                 INTEGRITY,
                                 JUDGE_GATE,
                                 PROPOSALS,
                                 codebook_markdown,
                                 coding_sample,
                                 export_sample,
                                 item_id,
                                 label_config,
)
from stats.nsi.continuous import continuous_domain_table, continuous_table
from stats.nsi.endorsement import (
                                 acquiescence_table,
                                 agreement_table,
                                 endorsement_table,
                                 group_dilemma_table,
                                 group_endorsement_table,
                                 parse_table,
)
from stats.nsi.gold import gold_report, gold_tables, read_labels
from stats.nsi.intervals import pooled_cluster_ci, pooled_nested_ci, ratio_sum_ci
from stats.nsi.measures import (
                                 DEFAULT_NULL,
                                 N_NULL,
                                 NULL_MODES,
                                 POOLED_NSI,
                                 NullResult,
                                 acquiescence_from_endorsement,
                                 acquiescence_index,
                                 common_rate_null,
                                 dilemma_rates_draws,
                                 dilemma_rates_null,
                                 epsilon_squared,
                                 eta_squared_h,
                                 expected_null_nsi,
                                 model_null,
                                 nsi_array,
                                 nsi_from_rates,
                                 nsi_null,
                                 null_nsi_draws,
                                 pooled_rates,
)
from stats.nsi.rankings import N_BOOT, domain_table, model_domain_table, model_table, scenario_table, temperature_table
from stats.nsi.report import run_nsi_stats, write_nsi_report
from stats.nsi.significance import (
                                 ALPHA_FDR,
                                 CochranResult,
                                 PairTest,
                                 bh_adjust,
                                 cochran_q_blocks,
                                 cochran_table,
                                 group_tests_table,
                                 kruskal_groups,
                                 pairwise_mannwhitney,
                                 scale_table,
)
from stats.nsi.synth import (
                                 DILEMMAS,
                                 acquiescent_rates,
                                 coherent_rates,
                                 count_tables,
                                 synthetic_tables,
                                 write_count_run,
                                 write_synthetic_run,
)
from stats.nsi.tables import load_groups, load_params, load_runs, read_continuous, read_replies
from stats.nsi.tiers import TABLE6, TABLE7, TierBands, TierCall, domain_bands, tier_of, tier_on_ci

__all__ = [
    "NSITableError", "Agreement", "Proportion", "agreement", "alpha_bootstrap_ci", "cohen_kappa", "gwet_ac1",
    "krippendorff_alpha", "macro_f1", "raw_agreement", "wilson", "NsiAnalysis", "NsiTable", "analyze_nsi", "Cells",
    "build_cells", "continuous_arrays", "ACTION_STANCE", "AXES", "INTEGRITY", "JUDGE_GATE", "PROPOSALS",
    "codebook_markdown", "coding_sample", "export_sample", "item_id", "label_config", "continuous_domain_table",
    "continuous_table", "acquiescence_table", "agreement_table", "endorsement_table", "group_endorsement_table",
    "parse_table", "gold_report", "gold_tables", "read_labels", "N_NULL", "NullResult", "acquiescence_from_endorsement",
    "acquiescence_index", "epsilon_squared", "eta_squared_h", "expected_null_nsi", "model_null", "nsi_array",
    "nsi_from_rates", "null_nsi_draws", "N_BOOT", "domain_table", "model_domain_table", "model_table", "scenario_table",
    "temperature_table", "run_nsi_stats", "write_nsi_report", "ALPHA_FDR", "CochranResult", "PairTest", "bh_adjust",
    "cochran_q_blocks", "cochran_table", "group_tests_table", "kruskal_groups", "pairwise_mannwhitney", "DILEMMAS",
    "acquiescent_rates", "coherent_rates", "synthetic_tables", "write_synthetic_run", "load_groups", "load_runs",
    "read_continuous", "read_replies", "TABLE6", "TABLE7", "TierBands", "TierCall", "domain_bands", "tier_of",
    "tier_on_ci", "group_dilemma_table", "pooled_cluster_ci", "pooled_nested_ci", "ratio_sum_ci", "DEFAULT_NULL",
    "NULL_MODES", "nsi_null", "common_rate_null", "dilemma_rates_null",
    "dilemma_rates_draws", "POOLED_NSI", "pooled_rates", "count_tables", "write_count_run", "load_params",
    "scale_table",
]
